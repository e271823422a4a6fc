"""`MultiTaskSplit`: one backbone, one tokenizer, one policy and several task heads, each task with
its own data, trained in the same stages as any `SplitTask` (docs/reuse.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.lightning_private import attached_trainer
from splitlab.model import Preprocessing, SplitMultiTask
from splitlab.model.head_settings import picked
from splitlab.tasks.base import SplitTask
from splitlab.tasks.detection import DetectionTask
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.segmentation import SegmentationTask
from splitlab.tasks.state import check_task_data, run_facts
from splitlab.tokenizer import TokenLayout
from splitlab.training import LossInputs

TASK_CLASSES: dict[str, type[SplitTask]] = {"detection": DetectionTask, "segmentation": SegmentationTask}


@dataclass
class TaskTargets:
    """A multi-task batch's targets: for each task, the positions of its images in the batch and its
    targets as its own task's logic unpacks them."""

    parts: dict[str, tuple[list[int], Any]]
    batch_size: int

    def images(self, times: int = 1) -> dict[str, list[int]]:
        """Each task's image positions in the batch, or in ``times`` copies of it one after another
        (PPO's rollouts)."""
        return {
            name: [p + r * self.batch_size for r in range(times) for p in positions]
            for name, (positions, _) in self.parts.items()
        }


class TaskMetrics(nn.Module):
    """Each task's metric collection, computed into one flat row: ``<task>/<metric>`` and ``mean``,
    the mean of every task's own metric (each task's `metric_name`)."""

    def __init__(self, collections: dict[str, MetricCollection], primary: dict[str, str]) -> None:
        super().__init__()
        self.tasks = nn.ModuleDict(collections)
        self.primary = primary

    def compute(self) -> dict[str, Tensor]:
        values: dict[str, Tensor] = {}
        for name, collection in self.tasks.items():
            for key, value in collection.compute().items():
                if isinstance(value, Tensor) and value.numel() == 1:
                    values[f"{name}/{key}"] = value
        main = [values.get(f"{name}/{metric}") for name, metric in self.primary.items()]
        known = [v.float() for v in main if v is not None]
        values["mean"] = torch.stack(known).mean() if len(known) == len(main) else torch.tensor(float("nan"))
        return values

    def reset(self) -> None:
        for collection in self.tasks.values():
            collection.reset()


class LossScale(nn.Module):
    """Each task's running mean per-image loss (``value``, a buffer: checkpointed, on the device)."""

    def __init__(self, tasks: int) -> None:
        super().__init__()
        self.register_buffer("value", torch.zeros(tasks))


class MultiTaskLogic(TaskLogic):
    """The tasks' own code as one `TaskLogic`: each task's batch unpacked by its own logic, its images
    given to its own head, its loss read in the scale of its running mean (`LossScale`).

    Args:
        model: the multi-task model (`SplitMultiTask`: one member per task).
        logics: each task's own logic, by name (in the model's task order).
        momentum: momentum of each task's running mean loss.
        reduce: a tensor's mean over ranks (the running means agree on every rank).
    """

    task_name = "multitask"
    metric_name = "mean"

    def __init__(
        self,
        model: SplitMultiTask,
        logics: dict[str, TaskLogic],
        momentum: float,
        reduce: Callable[[Tensor], Tensor],
    ) -> None:
        super().__init__(model)
        self.logics, self.momentum, self.reduce = logics, float(momentum), reduce
        self.scale = LossScale(len(logics))  # the task registers it: ``loss_scale`` in checkpoints
        self._composition: TaskTargets | None = None

    def build_metrics(self) -> TaskMetrics:
        return TaskMetrics(
            {name: logic.build_metrics() for name, logic in self.logics.items()},
            {name: logic.metric_name for name, logic in self.logics.items()},
        )

    def summary_columns(self) -> list[str]:
        return [f"{name}/{logic.metric_name}" for name, logic in self.logics.items()]

    def unpack_batch(self, batch: Any) -> tuple[Tensor, TaskTargets]:
        """The images of every task's batch, task after task, and each task's targets. The
        composition is kept for the heads: each reads its own task's images (`forward_layout`)."""
        if not isinstance(batch, dict):
            raise ValueError(
                f"{self.task_name} reads a batch of each task, by name ({sorted(self.logics)}): use "
                "splitlab.data.MultiTaskData, whose loaders Lightning's CombinedLoader combines"
            )
        images, parts, start = [], {}, 0
        for name, logic in self.logics.items():
            if batch.get(name) is None:  # a task whose loader ran out (evaluation's max_size mode)
                continue
            x, targets = logic.unpack_batch(batch[name])
            images.append(x)
            parts[name] = (list(range(start, start + x.shape[0])), targets)
            start += x.shape[0]
        if not images:
            raise ValueError(f"a batch with no task's images (tasks: {sorted(self.logics)})")
        self._composition = TaskTargets(parts, start)
        return torch.cat(images), self._composition

    def repeat_targets(self, targets: TaskTargets, times: int) -> TaskTargets:
        positions = targets.images(times)
        parts = {
            name: (positions[name], self.logics[name].repeat_targets(t, times))
            for name, (_, t) in targets.parts.items()
        }
        return TaskTargets(parts, targets.batch_size * times)

    def images_of(self, batch_size: int) -> dict[str, list[int]] | None:
        """Which images of a layout of ``batch_size`` each head reads: the last batch unpacked (every
        step unpacks its batch first), repeated for PPO's rollouts; None when nothing was unpacked."""
        unpacked = self._composition
        if unpacked is None or batch_size % unpacked.batch_size:
            return None
        return unpacked.images(batch_size // unpacked.batch_size)

    def forward_layout(self, layout: TokenLayout) -> dict[str, Any]:
        """Each head on its own task's images (the task's `forward` runs this too; the model's own
        forward runs every head on every image: inference)."""
        return self.model.forward_layout(layout, self.images_of(layout.batch_size))

    def per_image_loss(self, outputs: dict[str, Any], targets: TaskTargets, inputs: LossInputs) -> Tensor:
        """Each image's own task loss divided by that task's running mean loss (`loss_scale`): each
        task's losses average about 1, so neither the mean the task trains on nor PPO's reward favours
        the task whose loss is larger. The running means move while training, after the batch is
        scaled (the batch's own losses do not scale it; a run's first batch sets them)."""
        losses: Tensor | None = None
        for k, (name, (positions, task_targets)) in self._ordered(targets):
            loss = self.logics[name].per_image_loss(outputs[name], task_targets, inputs)
            first = self.model.training and not bool(self.scale.value[k] > 0)
            if first:
                self._update_scale(k, loss.detach())
            scaled = loss / self.scale.value[k].clamp(min=1e-8).to(loss.dtype)
            if self.model.training and not first:
                self._update_scale(k, loss.detach())
            losses = loss.new_zeros(targets.batch_size) if losses is None else losses
            losses = losses.index_copy(0, torch.tensor(positions, device=loss.device), scaled)
        return losses

    def _ordered(self, targets: TaskTargets) -> list[tuple[int, tuple[str, Any]]]:
        """Each task's part of ``targets`` with the task's index, in the model's task order."""
        names = list(self.logics)
        return sorted(((names.index(n), (n, part)) for n, part in targets.parts.items()), key=lambda x: x[0])

    def _update_scale(self, k: int, loss: Tensor) -> None:
        """Move task ``k``'s running mean loss towards this batch's (the same on every rank)."""
        mean = self.reduce(loss.float().mean())
        current = self.scale.value[k]
        momentum = self.momentum if bool(current > 0) else 0.0
        self.scale.value[k] = momentum * current + (1 - momentum) * mean

    def update_metrics(
        self, metrics: TaskMetrics, outputs: Any, targets: TaskTargets, layout: TokenLayout
    ) -> None:
        for name, (positions, task_targets) in targets.parts.items():
            self.logics[name].update_metrics(
                metrics.tasks[name], outputs[name], task_targets, layout.select(positions)
            )

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor | None:
        cells = []
        for name, logic in self.logics.items():
            if batch.get(name) is None:
                continue
            found = logic.annotated_cells(batch[name], grid)
            if found is None:
                return None
            cells.append(found)
        return torch.cat(cells)

    def describe_prediction(self, outputs: Any, index: int, target: Any = None) -> dict[str, Any]:
        composition = self._composition
        for name, (positions, _) in composition.parts.items() if composition else []:
            if index in positions:
                logic = self.logics[name]
                return {name: logic.describe_prediction(outputs[name], positions.index(index))}
        return {}


class MultiTaskSplit(SplitTask):
    """One SPLIT backbone, tokenizer and policy for several tasks, each with its own head and data.

    The batch of a step holds each task's batch (`splitlab.data.MultiTaskData`: Lightning's
    `CombinedLoader`); their images form one layout and one backbone pass, and each head reads its own
    task's images. The stages are `SplitTask`'s: dense, warm start (every task's loss), PPO with a
    reward from each image's own task loss divided by that task's running mean loss (`loss_scale`), so
    that no task drives the policy by the size of its loss alone. At inference one layout per image
    and one backbone pass serve every head (`splitlab.model.SplitMultiTask`). Each task's own code is
    its task class's `TaskLogic` (``task_logic``, by name), on that task's member model
    (`SplitMultiTask.members`) and with that task's own settings.

    Args:
        tasks: task name -> that task's settings: ``task`` (``detection`` or ``segmentation``) and
            its class's head and data settings (`DetectionTask`, `SegmentationTask`: ``num_classes``,
            ``pyramid_indices``, ``ignore_index``, ...).
        loss_momentum: momentum of each task's running mean loss (`loss_scale`).
        **kwargs: `SplitTask`'s settings, shared by every task (backbone, levels, budget, policy, PPO).
    """

    task_name = "multitask"
    metric_name = "mean"
    learned_name = "multitask"  # the summary's row and trained_policy: one policy of several tasks
    model_class = SplitMultiTask

    def __init__(
        self, tasks: dict[str, dict[str, Any]] | None = None, loss_momentum: float = 0.98, **kwargs: Any
    ) -> None:
        if not tasks:
            raise ValueError(
                "model.init_args.tasks: name each task with its settings, e.g. {coco: {task: detection, "
                "num_classes: 80}, ade20k: {task: segmentation, num_classes: 150}}"
            )
        if not 0.0 <= loss_momentum < 1.0:
            raise ValueError(f"loss_momentum={loss_momentum}: expected a value in [0, 1)")
        super().__init__(**kwargs)

    def build_logic(self) -> MultiTaskLogic:
        """Each task's own logic (its task class's, on its member model, with its own settings) as one."""
        logics: dict[str, TaskLogic] = {}
        for name, given in self.hparams.tasks.items():
            task_class = TASK_CLASSES[given["task"]]
            logic_class = task_class.logic_class
            logics[name] = logic_class(self.model.members[name], picked(logic_class.settings_class, given))
        return MultiTaskLogic(self.model, logics, self.hparams.loss_momentum, self.mean_over_ranks)

    def configure_models(self) -> None:
        super().configure_models()
        self.loss_scale = self.logic.scale  # each task's running mean loss, checkpointed
        self.register_load_state_dict_pre_hook(_older_loss_scale)

    @property
    def task_logic(self) -> dict[str, TaskLogic]:
        """Each task's own logic, by name."""
        return self.logic.logics

    # ----------------------------------------------------------------------------- data
    def check_data(self, datamodule: Any) -> None:
        """Every task's data checked against the run and its own task, as a single-task run checks it."""
        loaders, names = getattr(datamodule, "tasks", None), sorted(self.task_logic)
        if not isinstance(loaders, dict) or set(loaders) != set(names):
            raise ValueError(
                f"{type(self).__name__} with tasks {names} needs data of each by the same names "
                f"(splitlab.data.MultiTaskData with task_data {names}), got {type(datamodule).__name__}"
                + (f" with task_data {sorted(loaders)}" if isinstance(loaders, dict) else "")
            )
        facts = run_facts(attached_trainer(self))
        for name, logic in self.task_logic.items():
            check_task_data(type(self).__name__, self.model, self.hparams, logic, loaders[name], facts)

    def adopt_data(self, datamodule: Any) -> None:
        """Each task's names and category ids for its member, the first task's preprocessing for the
        model (one preprocessing feeds the one backbone pass)."""
        loaders = getattr(datamodule, "tasks", {})
        for name in self.task_logic:
            data = loaders.get(name)
            self.model.set_member_data(
                name, getattr(data, "names", None), getattr(data, "category_ids", None)
            )
        preprocessing = getattr(loaders.get(next(iter(self.task_logic))), "preprocessing", None)
        if isinstance(preprocessing, Preprocessing):
            self.model.preprocessing = preprocessing

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get("splitlab", {}).get("model", {}).get("head", {}).get("tasks", {})
        for name, settings in saved.items():
            if name in self.task_logic:
                self.model.set_member_data(name, settings.get("names"), settings.get("category_ids"))


def _older_loss_scale(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """A checkpoint from before `LossScale` holds the running means as ``loss_scale`` itself."""
    if prefix + "loss_scale" in state:
        state[prefix + "loss_scale.value"] = state.pop(prefix + "loss_scale")
