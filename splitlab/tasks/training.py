"""What a `SplitTask` checks and adds for its training: the run's callbacks (through the installed
package's entry points) and the warm-start labels a task can give. The training itself is the
training object's (`splitlab.training.SplitTraining`), its hooks `splitlab.tasks.hooks.TaskHooks`'."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from splitlab.tasks.logic import TaskLogic

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


def check_label_source(
    label_source: str, logic: TaskLogic, task_name: str, eval_baselines: tuple[str, ...] = ()
) -> None:
    """Refuse, at construction, warm-start labels or an evaluation row the task cannot give:
    ``fidelity`` and ``fidelity_oracle`` read the task's own prediction as targets
    (`TaskLogic.own_targets`)."""
    if type(logic).own_targets is not TaskLogic.own_targets:
        return
    if label_source == "fidelity":
        raise ValueError(
            f"warm_start.label_source=fidelity: {task_name} has no targets of its own "
            "prediction (TaskLogic.own_targets); use label_source=loss or embedding"
        )
    if "fidelity_oracle" in eval_baselines:
        raise ValueError(
            f"evaluation.eval_baselines includes fidelity_oracle: {task_name} has no targets of its own "
            "prediction (TaskLogic.own_targets); drop it (loss_oracle reads the targets instead)"
        )
