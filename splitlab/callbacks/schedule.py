"""`SplitSchedule`: dense pretraining (optional) -> warm start -> freeze -> PPO."""

from __future__ import annotations

import time
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info


class SplitSchedule(Callback):
    """Which stage each epoch trains: the one owner of the schedule.

    Epochs ``[0, dense)`` train backbone and head on the uniform grid (only for backbones without
    pretrained weights), the next ``warm_start_epochs`` run the warm start, and every epoch after
    that runs PPO with backbone, head and embeddings frozen (the paper's classification recipe is
    1 + 1). The stage is a function of the epoch, so a resumed run (Lightning restores the epoch,
    also mid-epoch) re-enters the right stage; the callback keeps no stage of its own. It talks to
    the task only through the task's API: ``plan_stages`` (epoch counts, for learning-rate
    schedules) and ``set_stage``. Each epoch's training time (validation excluded) is logged as
    ``time/<stage>_epoch_seconds``; the time of an epoch stopped half-way is in the checkpoint, so a
    resumed epoch logs all of it once.

    Args:
        warm_start_epochs: epochs of warm start.
        rl_epochs: epochs of PPO.
        dense_epochs: epochs of uniform-grid training before the warm start.
    """

    def __init__(self, warm_start_epochs: int = 1, rl_epochs: int = 1, dense_epochs: int = 0) -> None:
        for name, value in (
            ("warm_start_epochs", warm_start_epochs),
            ("rl_epochs", rl_epochs),
            ("dense_epochs", dense_epochs),
        ):
            if value < 0:
                raise ValueError(f"{name}={value} must be >= 0")
        self.warm_start_epochs = warm_start_epochs
        self.rl_epochs = rl_epochs
        self.dense_epochs = dense_epochs
        self._carried = 0.0  # an epoch's training time before the checkpoint this run resumed from

    @property
    def total_epochs(self) -> int:
        return self.dense_epochs + self.warm_start_epochs + self.rl_epochs

    def stage_at(self, epoch: int) -> str:
        """The stage of ``epoch`` (epochs past the schedule keep training the last stage)."""
        if epoch < self.dense_epochs:
            return "dense"
        if epoch < self.dense_epochs + self.warm_start_epochs:
            return "warm_start"
        if self.rl_epochs > 0:
            return "ppo"
        return "warm_start" if self.warm_start_epochs > 0 else "dense"

    def check(self, max_epochs: int | None) -> None:
        """Refuse a schedule longer than the trainer's ``max_epochs``."""
        if max_epochs is not None and max_epochs >= 0 and self.total_epochs > max_epochs:
            raise ValueError(
                f"dense_epochs + warm_start_epochs + rl_epochs = {self.dense_epochs} + {self.warm_start_epochs} + "
                f"{self.rl_epochs} = {self.total_epochs} is above trainer.max_epochs={max_epochs}"
            )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not hasattr(pl_module, "set_stage"):
            raise TypeError(f"SplitSchedule drives a SplitTask, got {type(pl_module).__name__}")
        self.check(trainer.max_epochs)
        pl_module.plan_stages(self.dense_epochs, self.warm_start_epochs, self.rl_epochs)

    def _enter(self, trainer: Trainer, pl_module: LightningModule, starting: bool = False) -> None:
        stage = self.stage_at(trainer.current_epoch)
        if starting:  # the task's own default stage is no "previous" stage of this run
            rank_zero_info(f"splitlab: epoch {trainer.current_epoch}: starting in stage {stage}")
        elif stage != pl_module.stage:
            rank_zero_info(f"splitlab: epoch {trainer.current_epoch}: stage {pl_module.stage} -> {stage}")
        pl_module.set_stage(stage)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._enter(trainer, pl_module, starting=True)
        # a resume in the middle of an epoch enters no epoch start: its time runs on from the checkpoint's
        self._started = self._last = time.perf_counter()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._enter(trainer, pl_module)
        self._started = self._last = time.perf_counter()
        self._carried = 0.0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._last = time.perf_counter()

    def epoch_seconds(self) -> float:
        """Training time of the current epoch so far, the part before a stop and resume included."""
        started = getattr(self, "_started", None)
        return self._carried + (0.0 if started is None else self._last - started)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the epoch's training time (validation excluded) under its stage: what a stage costs. An
        epoch a stop ended early is not finished: its time is logged when the resumed run finishes it."""
        progress = trainer.fit_loop.epoch_loop.batch_progress
        if trainer.should_stop and not progress.is_last_batch:
            return
        pl_module.log(f"time/{pl_module.stage}_epoch_seconds", self.epoch_seconds(), on_epoch=True)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_seconds": self.epoch_seconds()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._carried = float(state_dict.get("epoch_seconds", 0.0))
