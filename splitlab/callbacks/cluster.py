"""Surviving interruptions: mid-epoch resume at the exact sample, and SLURM's requeue signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import warnings
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from splitlab.callbacks.safety import GracefulStop
from splitlab.lightning_private import requeue_checkpoint_path, restart_train_iterator


def _train_loaders(trainer: Trainer) -> list[Any]:
    loaders = trainer.train_dataloader
    if loaders is None:
        return []
    flattened = getattr(loaders, "flattened", None)
    if flattened is not None:
        return list(flattened)
    if isinstance(loaders, dict):  # several loaders by name (a multi-task run's CombinedLoader)
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, list | tuple) else [loaders]


class ResumePosition(Callback):
    """On a restart, draw the resumed epoch's samples, and on a mid-epoch one skip those already seen.

    Lightning restores the loop counters (the epoch continues at batch ``k``) but a plain
    DataLoader starts its epoch from the top again, so without this the resumed run would see
    ``k`` batches twice and miss ``k`` others. Samplers with a ``skip`` method
    (`splitlab.data.ResumableSampler`) leave out the first ``k * batch_size`` indices of the
    restarted epoch; the order itself is a function of (seed, epoch), so the rest matches the
    uninterrupted run. Lightning builds the epoch's iterator before this hook and before it sets the
    sampler's epoch; DataLoader workers draw their first indices right then (epoch 0's order, no
    skip), so the epoch is set here and the iterator built again. The splitlab CLI adds this
    callback to every run (a plain ``Trainer`` needs it in its ``callbacks``).
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loop = trainer.fit_loop
        if not loop.restarting:
            return
        done = loop.epoch_loop.batch_progress.current.processed
        mid_epoch = 0 < done < trainer.num_training_batches
        for loader in _train_loaders(trainer):
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):  # the epoch Lightning will run (and set) next
                sampler.set_epoch(loop.epoch_progress.current.processed)
            if not mid_epoch:
                continue
            if hasattr(sampler, "skip") and loader.batch_size:
                # a shorter loader of several starts again when it runs out (max_size_cycle)
                sampler.skip((done % max(len(loader), 1)) * loader.batch_size)
                rank_zero_info(f"splitlab: resuming epoch {trainer.current_epoch} after batch {done}")
                # Lightning warns that a plain DataLoader cannot resume mid-epoch; this one now does
                warnings.filterwarnings(
                    "ignore", message="You're resuming from a checkpoint that ended before the epoch"
                )
            else:
                rank_zero_warn(
                    f"resuming mid-epoch at batch {done}, but the training sampler cannot skip what was seen: "
                    "the epoch restarts from its first batch (use splitlab.data.ResumableSampler)"
                )
        restart_train_iterator(trainer)  # drop what workers drew before the epoch and skip were set


class SlurmRequeue(GracefulStop):
    """Checkpoint and requeue when SLURM signals the end of the time slot (``#SBATCH --signal=SIGUSR1@90``).

    Lightning's own handler saves from inside the signal handler, i.e. at whatever instruction the
    signal interrupts: under manual optimisation that can be half-way through PPO's K updates, or
    between two ranks' collectives. As for any `GracefulStop`, the handler only raises a flag;
    at the end of the batch the ranks agree, every rank takes part in ``trainer.save_checkpoint``
    to ``default_root_dir/hpc_ckpt_N.ckpt`` (where Lightning looks when the requeued job starts
    under SLURM), rank 0 runs ``scontrol requeue``, and training stops (exit 0: the job goes on
    after the requeue; 128 + signal, with a warning, when it could not be requeued). Registering
    the handler in ``setup`` keeps Lightning from installing its own.

    Args:
        signal_name: the signal SLURM sends (``--signal``), SIGUSR1 by default.
    """

    register_at_setup = True

    def __init__(self, signal_name: str = "SIGUSR1") -> None:
        if not hasattr(signal, signal_name):
            raise ValueError(f"signal_name={signal_name!r} is not a signal of this platform")
        super().__init__((signal_name,))

    def checkpoint_path(self, trainer: Trainer) -> str:
        return requeue_checkpoint_path(trainer)

    def after_checkpoint(self, trainer: Trainer, signum: int) -> None:
        rank_zero_info(f"splitlab: SLURM requeue signal: saved {self.checkpoint}")
        if trainer.is_global_zero:
            for logger in trainer.loggers:  # the requeue ends this job soon: its logs reach disk first
                logger.save()
            job = os.environ.get("SLURM_ARRAY_JOB_ID")
            job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ.get("SLURM_JOB_ID", "")
            if re.fullmatch(r"[0-9_]+", job or ""):
                try:
                    result = subprocess.call(["scontrol", "requeue", job])
                except OSError as err:  # no scontrol inside this container, say
                    result, why = None, f"{err}"
                else:
                    why = f"exit code {result}"
                if result == 0:
                    rank_zero_info(f"splitlab: scontrol requeue {job}: requeued")
                    return
                rank_zero_warn(
                    f"scontrol requeue {job} failed ({why}): the job ends here, unfinished; resume it with "
                    f"--ckpt_path {self.checkpoint}"
                )
            else:
                rank_zero_warn("SLURM requeue signal outside a SLURM job (no SLURM_JOB_ID): not requeued")
            self.stopped_by = signum  # not requeued: exit 128 + signal, so SLURM marks the job failed
