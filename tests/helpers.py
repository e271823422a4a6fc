"""What several test rooms share: the recipes' and CI twins' ``--config`` arguments, the tiny CI-twin
arguments, schedules, baseline layouts, and the subprocess launcher and probes of the multi-process
(DDP, SLURM) tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from lightning import Callback

from splitlab.cli import lightning_main
from splitlab.commands.demo import PIPELINES
from splitlab.tokenizer import baseline_scores

REPO = Path(__file__).resolve().parents[1]


def twin_configs(task: str = "classification") -> list[str]:
    """``--config`` arguments of ``task``'s recipe (``tasks/``) and its CI twin (``configs/ci/``) in this
    checkout: the files the tests exercise, whatever copy of splitlab is installed."""
    recipe, twin, _ = PIPELINES[task]
    return ["--config", str(REPO / "tasks" / recipe), "--config", str(REPO / "configs" / "ci" / twin)]


def composed_config(out: Path, *configs: str | Path, flags: Sequence[str] = ()) -> dict:
    """The config the LightningCLI builds from ``configs`` in turn, then ``flags`` (``fit
    --print_config``), as written to ``out`` and read back."""
    import contextlib

    import pytest
    import yaml

    args = ["fit", *(a for c in configs for a in ("--config", str(c))), *flags, "--print_config"]
    with open(out, "w") as f, contextlib.redirect_stdout(f), pytest.raises(SystemExit):
        lightning_main(args)
    return yaml.safe_load(Path(out).read_text())


def tiny_args(root, log_dir, *extra: str) -> list[str]:
    """CLI arguments of the CI classification twin (a budget-conditioned policy for 0.3-0.7 deployed at
    0.5), shrunk further for unit tests and evaluated at its target only."""
    return [
        *twin_configs(),
        f"--data.init_args.root={root}",
        "--data.init_args.batch_size=8",
        f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.logger.init_args.name=",
        "--trainer.logger.init_args.version=",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.backbone_kwargs.embed_dim=32",
        "--model.init_args.backbone_kwargs.depth=2",
        "--model.init_args.backbone_kwargs.num_heads=2",
        "--model.init_args.tokenizer.decision_dim=16",
        "--model.init_args.tokenizer.decision_heads=2",
        "--model.init_args.ppo.samples=2",
        "--model.init_args.ppo.epochs=2",
        "--model.init_args.warm_start.imitation_steps=1",  # one decision-module update per warm-start batch
        "--model.init_args.evaluation.eval_budgets=[]",
        *extra,
    ]


def fit(root, log_dir, *extra: str):
    """``fit`` of the tiny classification twin, in process; returns the CLI (``.model``, ``.trainer``)."""
    return lightning_main(["fit", *tiny_args(root, log_dir, *extra)])


def schedule_args(warm: int, rl: int, dense: int = 0, also: Sequence[dict] = ()) -> list[str]:
    """Override the trainer's callbacks: this schedule, pictures, a checkpoint every epoch (and ``also``)."""
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": warm, "rl_epochs": rl, "dense_epochs": dense},
        },
        {"class_path": "splitlab.callbacks.TokenMapPictures"},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "save_top_k": -1},
        },
        *also,
    ]
    return [f"--trainer.max_epochs={dense + warm + rl}", f"--trainer.callbacks={json.dumps(callbacks)}"]


def probe(out) -> dict:
    """A `RankProbe` callback entry (it also counts the batches run in this process)."""
    return {"class_path": "tests.helpers.RankProbe", "init_args": {"out": str(out)}}


def batches_run(cli) -> int:
    """Training batches this process ran (the `RankProbe` among ``cli``'s callbacks)."""
    return next(c.batches for c in cli.trainer.callbacks if isinstance(c, RankProbe))


# Lightning's own launcher forks the second rank: DDP over gloo on this machine's CPU
TWO_CPU_RANKS = (
    "--trainer.accelerator=cpu",
    "--trainer.devices=2",
    "--trainer.num_nodes=1",
    "--trainer.strategy=ddp",
)


def two_rank_args(root, log_dir, callbacks: list[dict], max_epochs: int, *extra: str) -> list[str]:
    """``fit`` arguments of the tiny twin on 2 CPU ranks (DDP over gloo) with these callbacks."""
    return tiny_args(
        root,
        log_dir,
        "--data.init_args.batch_size=4",
        *TWO_CPU_RANKS,
        f"--trainer.max_epochs={max_epochs}",
        f"--trainer.callbacks={json.dumps(callbacks)}",
        "--model.init_args.evaluation.eval_baselines=[]",
        *extra,
    )


def layout_of(name: str, tokenizer, backbone, images, **kwargs):
    """A baseline layout (``uniform``, ``coarse``, ``random``, ``entropy``) through the tokenizer."""
    scores, threshold = baseline_scores(name, images, tokenizer.levels, **kwargs)
    return tokenizer(images, backbone, mode="scores", scores=scores, threshold=threshold)


def slurm_job(job_id: str, **extra: str) -> dict[str, str]:
    """The environment ``srun`` gives one task of a 2-task, 1-node job (``launch`` adds the rank)."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": "splitlab-test",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        **extra,
    }


def launch(
    args: Sequence[str],
    env: dict[str, str] | None = None,
    slurm_ranks: int = 0,
    fails: bool = False,
    timeout: float = 600,
) -> list[str]:
    """Run ``python -m splitlab <args>`` in subprocesses and return their output (asserting exit 0, or
    with ``fails`` a non-zero exit of every process; all within ``timeout`` seconds, so a hang fails).

    With ``slurm_ranks`` the ranks are started here, one process each with ``SLURM_PROCID`` set
    (as ``srun`` does); otherwise one process, which Lightning's DDP launcher forks itself. The
    repository root is on ``PYTHONPATH`` so configs can name ``tests.helpers.RankProbe``.
    """
    base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    ranks = [{"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in range(slurm_ranks)] or [{}]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "splitlab", *args],
            env={**base, **rank_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank_env in ranks
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(
            f"{len(procs)} process(es) still running after {timeout} s: {[p.poll() for p in procs]}"
        ) from None
    for p, out in zip(procs, outputs, strict=True):
        assert (p.returncode != 0) if fails else (p.returncode == 0), out[-3000:]
    return outputs


class RankProbe(Callback):
    """Each rank writes its final stage, λ and cut of every budget point, policy weights and how many
    batches it ran to ``out/rank<r>.pt``."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_train_end(self, trainer, pl_module) -> None:
        state = {
            "stage": pl_module.stage,
            "lambda": pl_module.controller.values.tolist(),
            "cuts": pl_module.tokenizer.operating_points.cuts.tolist(),
            "decision": {k: v.detach().cpu() for k, v in pl_module.tokenizer.decision.state_dict().items()},
            "backbone_head": pl_module.backbone.model.head.weight.detach().cpu(),
            "world_size": trainer.world_size,
            "steps": pl_module.controller.total_steps,
            "batches_run_here": self.batches,
            "draw": torch.rand(4, generator=pl_module.generator).tolist(),  # this rank's sampling stream
        }
        os.makedirs(self.out, exist_ok=True)
        torch.save(state, os.path.join(self.out, f"rank{trainer.global_rank}.pt"))


class StartWeights(Callback):
    """Keeps a copy of the model's weights as training starts (read back from ``cli.trainer.callbacks``)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


class EpochEndWeights(Callback):
    """Keeps a copy of the model's weights at the end of each training epoch (``weights[epoch]``)."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.weights[trainer.current_epoch] = {
            k: v.detach().clone() for k, v in pl_module.state_dict().items()
        }


class SignalAt(Callback):
    """Sends a signal (SLURM's requeue signal SIGUSR1 by default) to this process at one batch of one
    epoch, on rank 0 only."""

    def __init__(self, epoch: int, batch: int, signal_name: str = "SIGUSR1") -> None:
        self.epoch, self.batch, self.signal_name = epoch, batch, signal_name

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch and trainer.global_rank == 0:
            import signal

            os.kill(os.getpid(), getattr(signal, self.signal_name))


class LostCheckpointWrites(Callback):
    """The checkpoint disk loses every write, as Lightning's atomic save hides a failed one (an
    unwritable folder); `VerifiedCheckpointIO` checks without retrying."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        import lightning.fabric.plugins.io.torch_io as torch_io

        from splitlab.callbacks import VerifiedCheckpointIO

        torch_io._atomic_save = lambda checkpoint, path: None
        io = trainer.strategy.checkpoint_io
        assert isinstance(io, VerifiedCheckpointIO), type(io)
        io.retries, io.wait = 0, 0.0


def one_point_curve(run_dir, dest, record: dict, tolerance: float) -> dict:
    """`splitlab curve RUN_DIR` of a run trained for budget 0.5: by default its one point, checked against
    the run's own summary (task, metric, every policy, the learned metric within ``tolerance``)."""
    import json

    from splitlab.commands import run

    args = [
        "curve",
        str(run_dir),
        "--out",
        str(dest),
        "--trainer.enable_progress_bar=false",
    ]
    assert run(args) == 0
    curve = json.loads((dest / "curve.json").read_text())
    assert (curve["task"], curve["metric"]) == (record["task"], record["metric"])
    (point,) = curve["points"]
    shown = {"learned", "random", "entropy", "uniform"} | (
        {"oracle", "loss_oracle"} & set(record["policies"])
    )
    assert point["target"] == 0.5 and set(point["policies"]) == shown  # the oracle where the run has one
    learned = record["policies"]["learned"]["metric"]
    assert abs(point["policies"]["learned"]["metric"] - learned) <= tolerance
    assert point["policies"]["uniform"]["token_fraction_mean"] == 1.0
    assert (dest / "curve.png").stat().st_size > 0
    return point


class SlowBatches(Callback):
    """Sleep after every training batch: a tiny twin's epoch lasts long enough for a SLURM time limit
    to fall in the middle of it (sleeping changes no number)."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args, **kwargs) -> None:
        import time

        time.sleep(self.seconds)
