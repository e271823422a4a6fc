"""`splitlab bench --train`: what one training step of each stage costs per image.

A real fit, as the recipes run it (`ClassificationTask`, `SplitSchedule` with one epoch of each
stage, Lightning's loop and manual optimisation), on one fixed batch of random images repeated, so
that every stage steps on the same backbone and batch. Each step is clocked from Lightning's batch
start to its end (the device synchronised at both); the first ``warmup`` steps of each stage are
discarded. Inside PPO's step the rollouts' forward passes through the frozen backbone and head are
clocked too: what of PPO's cost is scoring samples and what is updating the decision module.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from splitlab.callbacks import SplitSchedule
from splitlab.metrics import synchronize
from splitlab.training.progress import STAGES

PRECISION = {"float32": "32-true", "bfloat16": "bf16-mixed"}


class StepClock(Callback):
    """Seconds of each training step, by stage, and of the PPO rollouts' scoring passes."""

    def __init__(self) -> None:
        self.steps: dict[str, list[float]] = defaultdict(list)
        self.rollouts: list[float] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        forward = pl_module.logic.forward_layout  # what the training object scores rollouts with

        def clocked(layout: Any) -> Any:  # PPO scores its samples without autograd
            if pl_module.stage != "ppo" or torch.is_grad_enabled():
                return forward(layout)
            synchronize(pl_module.device)
            started = time.perf_counter()
            outputs = forward(layout)
            synchronize(pl_module.device)
            self._rollout += time.perf_counter() - started
            return outputs

        pl_module.logic.forward_layout = clocked

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        synchronize(pl_module.device)
        self._rollout = 0.0
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        synchronize(pl_module.device)
        self.steps[pl_module.stage].append(time.perf_counter() - self._started)
        if pl_module.stage == "ppo":
            self.rollouts.append(self._rollout)


@contextmanager
def quiet_fit() -> Iterator[None]:
    """The fit's own console lines (devices found, stage changes, no validation loop, not under
    ``srun``) left out: the bench prints its table."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*val_dataloader.*")
            warnings.filterwarnings("ignore", message=".*srun.*")
            yield
    finally:
        logger.setLevel(level)


def bench_train(
    model: str,
    batch_size: int,
    budget: float,
    levels: list[int] | None = None,
    img_size: int | None = None,
    patch_size: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    warmup: int = 1,
    iters: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Seconds per image of a dense, a warm-start and a PPO step (its rollouts apart), from a fit.

    Args:
        model: timm model name (random init).
        batch_size: images per step (PPO scores ``ppo.samples`` layouts of each).
        budget: the token budget the warm start and PPO train for.
        levels: patch sizes coarse to fine (default: the model's).
        img_size: image side (default: the model's).
        patch_size: patch size (default: the model's).
        dtype: ``float32`` or ``bfloat16`` (mixed precision, as the recipes train).
        device: ``cpu`` or ``cuda``.
        warmup: steps of each stage discarded before the clock counts.
        iters: steps of each stage timed.
        seed: seed of the weights and the batch.
    """
    if dtype not in PRECISION:
        raise ValueError(f"--dtype {dtype}: training runs in {sorted(PRECISION)} (float16 is refused)")
    torch.manual_seed(seed)
    task = fresh_task(model, budget, levels, img_size, patch_size, seed)
    side = task.backbone.img_size
    images = torch.randn(batch_size, 3, *side).repeat(warmup + iters, 1, 1, 1)
    labels = torch.randint(0, 10, (batch_size,)).repeat(warmup + iters)
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch_size)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as folder, quiet_fit():
        timing_trainer(device, dtype, folder, clock).fit(task, train_dataloaders=loader)
    per_image = {stage: statistics.median(clock.steps[stage][warmup:]) / batch_size for stage in STAGES}
    rollout = statistics.median(clock.rollouts[warmup:]) / batch_size
    return {
        "config": {
            "model": model,
            "batch_size": batch_size,
            "budget": budget,
            "levels": list(task.levels.sizes),
            "img_size": list(side),
            "dtype": dtype,
            "device": device,
            "iters": iters,
            "ppo_samples": task.hparams.ppo.samples,
            "ppo_epochs": task.hparams.ppo.epochs,
            "imitation_steps": task.hparams.warm_start.imitation_steps,
        },
        "steps_timed": {stage: len(clock.steps[stage][warmup:]) for stage in STAGES},
        "ms_per_image": {stage: 1e3 * s for stage, s in per_image.items()},
        "ppo_rollout_ms_per_image": 1e3 * rollout,
        "ppo_rollout_share": rollout / per_image["ppo"],
        "relative_to_dense": {stage: s / per_image["dense"] for stage, s in per_image.items()},
    }


def fresh_task(
    model: str,
    budget: float,
    levels: list[int] | None,
    img_size: int | None,
    patch_size: int | None,
    seed: int,
) -> LightningModule:
    """A `ClassificationTask` around a fresh timm ``model`` (10 classes, no baseline rows), as a recipe
    would build it: what every stage of the timed fit steps."""
    from splitlab.tasks import ClassificationTask

    sizes = {"img_size": img_size, "patch_size": patch_size}
    return ClassificationTask(
        backbone=model,
        backbone_kwargs={k: v for k, v in sizes.items() if v},
        tokenizer={"levels": levels},
        budget=budget,
        num_classes=10,
        evaluation={"eval_baselines": []},
        policy_options={"sampling_seed": seed},
    )


def timing_trainer(device: str, dtype: str, folder: str, clock: StepClock) -> Trainer:
    """A Trainer that runs one epoch of each stage and nothing else (no validation, logging,
    checkpoints or progress bar), so the clock times the training steps alone."""
    return Trainer(
        accelerator=torch.device(device).type,
        devices=1,
        precision=PRECISION[dtype],
        max_epochs=len(STAGES),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
        callbacks=[SplitSchedule(warm_start_epochs=1, rl_epochs=1, dense_epochs=1), clock],
    )


def format_train(result: dict[str, Any]) -> str:
    """The table ``splitlab bench --train`` prints."""
    cfg = result["config"]
    lines = [
        f"{cfg['model']} {cfg['img_size'][0]}px, levels {cfg['levels']}, batch {cfg['batch_size']}, "
        f"budget {cfg['budget']:g}, {cfg['dtype']} on {cfg['device']}; PPO: {cfg['ppo_samples']} samples "
        f"per image, {cfg['ppo_epochs']} policy epochs per batch (median of {cfg['iters']} steps a stage)",
        "| stage | ms per image | × dense |",
        "|---|---|---|",
    ]
    for stage in STAGES:
        lines.append(
            f"| {stage} | {result['ms_per_image'][stage]:.1f} | {result['relative_to_dense'][stage]:.2f} |"
        )
    lines.append(
        f"PPO's rollouts (the frozen backbone and head scoring the samples): "
        f"{result['ppo_rollout_ms_per_image']:.1f} ms per image, {result['ppo_rollout_share']:.0%} of its step"
    )
    return "\n".join(lines)
