"""`TaskLogic`: a task's own code as a plain object, not a module of the run.

What a batch holds, the per-image loss, the metrics, the cells the annotations mark, the data the
task accepts and a prediction's summary: built from the task's model (its head, names, levels) and
the task's own settings, and told explicitly whatever else it reads of the run (`LossInputs`,
`RunFacts`). A single-task `SplitTask` holds one (``logic``), `MultiTaskSplit` one per task, by
name, each on that task's member model: the same code, the same numbers, no attribute borrowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.model import SplitModel
from splitlab.model.head_settings import NoSettings
from splitlab.tokenizer import TokenLayout
from splitlab.training.task import LossInputs


@dataclass(frozen=True)
class RunFacts:
    """What a data check may read of the trainer: whether it fits, over how many ranks, and whether
    it synchronises BatchNorm layers across them (``trainer.sync_batchnorm``)."""

    fitting: bool = False
    world_size: int = 1
    synced_batchnorm: bool = False


class TaskLogic:
    """The code of a task that a batch of plain tensors needs: the defaults here are those of a task
    whose batches are ``(images, labels)`` tensors; each task's class overrides what differs.

    Args:
        model: the task's model (a single-task run's `SplitModel`, or a multi-task model's member):
            its head, names and levels.
    """

    task_name: ClassVar[str] = "task"
    metric_name: ClassVar[str] = "metric"
    num_classes: int | None = None  # classes of the task's head (None where the task has no class count)
    settings_class: ClassVar[type] = NoSettings  # the settings it reads, given to it explicitly

    def __init__(self, model: SplitModel, settings: Any = None) -> None:
        self.model = model
        self.settings = settings if settings is not None else self.settings_class()

    @property
    def head(self) -> nn.Module | None:
        return self.model.head

    @property
    def finest(self) -> int:
        """The finest patch size: the cell in which annotations and coverage are read."""
        return self.model.levels.finest

    def unpack_batch(self, batch: Any) -> tuple[Tensor, Any]:
        """``(images, targets)`` of a batch."""
        return batch[0], batch[1]

    def repeat_targets(self, targets: Any, times: int) -> Any:
        """Targets for ``times`` rollouts of the batch, rollout after rollout."""
        return targets.repeat(times, *([1] * (targets.dim() - 1)))

    def forward_layout(self, layout: TokenLayout) -> Any:
        """The task's outputs on a layout: the model's packed backbone and head."""
        return self.model.forward_layout(layout)

    def per_image_loss(self, outputs: Any, targets: Any, inputs: LossInputs) -> Tensor:
        """The task loss of each image, shape ``(B,)``: its mean trains the task, its values are PPO rewards."""
        raise NotImplementedError

    def own_targets(self, reference: Any, targets: Any) -> Any:
        """The model's own prediction from ``reference`` (its outputs on the finest grid) as targets
        `per_image_loss` reads in place of ``targets`` (whose padding it keeps): the ``fidelity``
        label source, the splits that keep the outputs closest to the finest grid's."""
        raise NotImplementedError(
            f"warm_start.label_source=fidelity: the {self.task_name} task has no targets of its own "
            "prediction; use label_source=loss or embedding"
        )

    def build_metrics(self) -> MetricCollection:
        """A fresh metric collection of the task (keys are metric names, one is `metric_name`)."""
        raise NotImplementedError

    def update_metrics(
        self, metrics: MetricCollection, outputs: Any, targets: Any, layout: TokenLayout
    ) -> None:
        """Feed one batch (and the layout it was computed on) to a metric collection."""
        raise NotImplementedError

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor | None:
        """``(B, rows, cols)`` bool: the finest cells a batch's annotations (boxes, masks) say need finest
        tokens, or None (the default); the ``oracle`` row and ``label_source: annotations`` read it."""
        return None

    def check_data(self, datamodule: Any, run: RunFacts) -> None:
        """Refuse data this task cannot learn from, in one line naming the setting (after the run's
        own checks: image size, annotations, classes); none by default."""

    def finish_outputs(self, outputs: Any, targets: Any) -> Any:
        """Inference work after the task head that belongs in images/s (VQA: the language model
        answering); the default has none."""
        return outputs

    def finish_results(self, results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """Each policy's computed metrics, before they are logged and tabulated (the labelled-pixel
        count the coverage metric keeps is for segmentation only)."""
        for row in results.values():
            row.pop("labelled_pixels", None)
        return results

    def summary_columns(self) -> list[str]:
        """Further metrics the summary table shows beside `metric_name` (the hard twins' coverages);
        none by default."""
        return []

    def describe_prediction(self, outputs: Any, index: int, target: Any = None) -> Any:
        """A JSON-friendly summary of one image's prediction (``target``: its batch entry, if any)."""
        return None
