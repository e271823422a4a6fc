"""Lightning's part of a `SplitTask`'s training: the run's callbacks, entering a stage, and the training
step, which hands each batch to the training object (`splitlab.training.SplitTraining`: the stages, the
warm start, PPO, λ and the budgets) with Lightning's optimizers, distributed backward and clipping."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from splitlab.lightning_private import attached_trainer
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.optimization import Optimization
from splitlab.training import Optimizers
from splitlab.training.progress import Stage

RUN_CALLBACKS_GROUP = "splitlab.run_callbacks"  # pyproject.toml's entry points: who adds run callbacks


def run_callbacks(given: Sequence[Any], fitting: bool) -> list[Any]:
    """The run callbacks ``given`` lacks, from every provider of the `RUN_CALLBACKS_GROUP` entry points
    (splitlab's own: `splitlab.callbacks.run.missing_run_callbacks`): tasks/ imports no callback, the
    installed package names them. A checkout used without ``pip install`` has none: it says so."""
    providers = entry_points(group=RUN_CALLBACKS_GROUP)
    if not providers:
        rank_zero_warn(
            "splitlab is not installed (no splitlab.run_callbacks entry points): Trainer().fit(task) runs "
            "without its stage schedule and run callbacks; pip install -e . in the checkout"
        )
    added: list[Any] = []
    for provider in sorted(providers, key=lambda p: p.name != "splitlab"):  # splitlab's own first
        added += provider.load()([*given, *added], fitting)
    return added


class StageTraining(Optimization):
    """Which stage runs and the training step, driven through the task's training object
    (``algorithm``), which examples/plain_pytorch.py and examples/fabric.py drive too.

    Builds on `Optimization` (its optimizers, learning rates and gradient sync); uses of its task
    only what `SplitTask` defines (``algorithm``, ``logic``, ``controller``) and Lightning's.
    """

    def configure_callbacks(self) -> list[Any]:
        """The run's callbacks the trainer lacks (`splitlab.callbacks.RUN_CALLBACKS`): the stage
        schedule, exact resume, the checkpoint on a stop, skipped-sample counts, verified checkpoint
        writes. ``Trainer().fit(task, data)`` from Python so trains what ``lightning fit`` trains
        (warm start, then PPO); callbacks the user passes, a `SplitSchedule` included, win."""
        return run_callbacks(self.trainer.callbacks, fitting=self.trainer.state.fn == "fit")

    def set_stage(self, stage: Stage) -> None:
        """Enter a stage (`SplitTraining.enter`: PPO freezes backbone, head and embeddings)."""
        self.algorithm.enter(stage, self.training)
        if self.task_frozen and attached_trainer(self) is not None and self.trainer.optimizers:
            self.trainer.optimizers[0].zero_grad(set_to_none=True)  # else they stay allocated all stage

    @property
    def task_frozen(self) -> bool:
        """Whether this stage leaves backbone, head and embeddings as they are (`Progress.task_frozen`)."""
        return self.algorithm.task_frozen

    def train(self, mode: bool = True) -> StageTraining:
        super().train(mode)
        if mode and self.task_frozen:  # frozen parts stay deterministic: no dropout in rewards
            for module in self.algorithm.task_modules():
                module.eval()
        return self

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        images, targets = self.unpack_batch(batch)
        task_opt, policy_opt = self.optimizers()
        steps = Optimizers(  # Lightning's steps, distributed backward and clipping; the steps so far
            task_opt,
            policy_opt,
            self.lr_schedulers(),
            self.ppo_total_steps,
            self.global_step,
            self.backward_synced,
            self.clip_norm,
        )
        stats = self.algorithm.training_step(images, targets, batch, steps)
        if stats is None:
            return None  # nothing learns: a fixed (or frozen transferred) policy with the task frozen
        batch_size = images.shape[0]
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=batch_size)
        self.log("lambda", self.controller.value_at(self.budget), prog_bar=True, batch_size=batch_size)
        return stats["loss"]

    def check_label_source(self) -> None:
        """Refuse, at construction, warm-start labels this task cannot give: ``fidelity`` reads the
        task's own prediction as targets (`TaskLogic.own_targets`)."""
        if self.hparams.warm_start.label_source != "fidelity":
            return
        if type(self.logic).own_targets is TaskLogic.own_targets:
            raise ValueError(
                f"warm_start.label_source=fidelity: {type(self).__name__} has no targets of its own "
                "prediction (TaskLogic.own_targets); use label_source=loss or embedding"
            )
