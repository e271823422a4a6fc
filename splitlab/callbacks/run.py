"""The callbacks every splitlab run needs, stated once: the CLI adds them, and a `SplitTask` supplies
them to a plain ``Trainer().fit(task, data)`` (`configure_callbacks`), so both run the same training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info

from splitlab.callbacks.cluster import ResumePosition, SlurmRequeue
from splitlab.callbacks.predictions import LayoutWriter
from splitlab.callbacks.safety import AgreedCheckpointSave, GracefulStop, SkippedSamples, VerifiedCheckpointIO
from splitlab.callbacks.schedule import SplitSchedule


class SafeCheckpoints(Callback):
    """Checkpoints written through `VerifiedCheckpointIO` (a failed write stops the run, naming the
    file) and saved by `AgreedCheckpointSave` (every rank stops alike). Installed at setup, before
    Lightning restores or saves anything; a checkpoint IO of the user's own is kept."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        install_safe_checkpoints(trainer)


def install_safe_checkpoints(trainer: Trainer) -> None:
    """Put `VerifiedCheckpointIO` and `AgreedCheckpointSave` on ``trainer``'s strategy (idempotent)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = VerifiedCheckpointIO()
    AgreedCheckpointSave.install(trainer.strategy)


RUN_CALLBACKS: tuple[type[Callback], ...] = (
    SplitSchedule,  # which stage each epoch trains (1 warm-start epoch, then PPO, unless configured)
    ResumePosition,  # a resume continues at the exact batch
    LayoutWriter,  # predict writes each image's layout
    GracefulStop,  # SIGTERM / Ctrl-C leave a checkpoint
    SkippedSamples,  # the samples the data skipped are counted and reported
    SafeCheckpoints,  # a checkpoint that cannot be written stops the run
)


def missing_run_callbacks(given: Sequence[Any], fitting: bool) -> list[Callback]:
    """The run callbacks ``given`` lacks, built with their defaults (a user's own always wins).

    A `SlurmRequeue` counts as the SIGUSR1 stop only, not as `GracefulStop`; in a SLURM job a fit
    also gets a `SlurmRequeue` (Lightning's own SIGUSR1 handler saves from inside the signal handler).
    """

    def present(cls: type) -> bool:
        return any(type(c) is cls if cls is GracefulStop else isinstance(c, cls) for c in given)

    missing: list[type[Callback]] = [cls for cls in RUN_CALLBACKS if not present(cls)]
    if fitting and SLURMEnvironment.detect() and not present(SlurmRequeue):
        rank_zero_info(
            "splitlab: a SLURM job: adding SlurmRequeue (SIGUSR1 checkpoints at a batch end, requeues)"
        )
        missing.append(SlurmRequeue)
    if fitting and SplitSchedule in missing:
        rank_zero_info(
            "splitlab: no SplitSchedule in the trainer's callbacks: using 1 warm-start epoch, then PPO"
        )
    return [cls() for cls in missing]
