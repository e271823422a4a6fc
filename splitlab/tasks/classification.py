"""`ClassificationTask`: SPLIT image classification with timm's own head, and
`ClassificationLogic`, its own code (loss, metrics, annotations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from splitlab.data.objects import box_cells
from splitlab.model import SplitClassifier
from splitlab.model.head_settings import ClassificationHeadSettings
from splitlab.tasks.base import SplitTask
from splitlab.tasks.logic import LossInputs, TaskLogic
from splitlab.tokenizer import TokenLayout


@dataclass(frozen=True)
class ClassificationSettings:
    """What classification's code reads of its task's settings.

    Attributes:
        label_smoothing: cross-entropy label smoothing.
    """

    label_smoothing: float = 0.0


class ClassificationLogic(TaskLogic):
    """Classification's own code: per-image cross-entropy, top-1 and top-5 accuracy.

    Args:
        model: the task's `SplitClassifier` (its classes are its timm head's).
        settings: `ClassificationSettings`.
    """

    task_name = "classification"
    metric_name = "top1"
    settings_class = ClassificationSettings
    settings: ClassificationSettings

    @property
    def num_classes(self) -> int:
        return int(self.model.num_classes)

    def build_metrics(self) -> MetricCollection:
        classes = self.num_classes
        return MetricCollection(
            {
                "top1": MulticlassAccuracy(classes, top_k=1, average="micro"),
                "top5": MulticlassAccuracy(classes, top_k=min(5, classes), average="micro"),
            }
        )

    def per_image_loss(self, outputs: Tensor, targets: Tensor, inputs: LossInputs) -> Tensor:
        return F.cross_entropy(
            outputs.float(), targets, reduction="none", label_smoothing=self.settings.label_smoothing
        )

    def own_targets(self, reference: Tensor, targets: Tensor) -> Tensor:
        """The finest grid's class probabilities: the cross-entropy to them is the KL divergence from
        the finest grid's prediction, up to a constant."""
        return reference.float().softmax(-1)

    def update_metrics(
        self, metrics: MetricCollection, outputs: Tensor, targets: Tensor, layout: TokenLayout
    ) -> None:
        metrics.update(outputs.float(), targets)

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor | None:
        """The finest cells the image's object box touches, where the data gives boxes
        (``data.init_args.objects``: batches ``(images, labels, boxes)``)."""
        boxes = batch[2] if isinstance(batch, list | tuple) and len(batch) > 2 else None
        if not isinstance(boxes, Tensor) or boxes.shape[-1:] != (4,):
            return None
        return box_cells(boxes.float(), self.finest, grid)

    def describe_prediction(self, outputs: Tensor, index: int, target: Any = None) -> dict[str, Any]:
        probs = outputs[index].float().softmax(-1)
        best = int(probs.argmax())
        return {"class": self.model.name_of(best), "index": best, "probability": float(probs.max())}


class ClassificationTask(SplitTask):
    """Classification: the timm model's head (CLS token or mean pool, `SplitClassifier`), per-image
    cross-entropy (the task's own code: `ClassificationLogic`).

    The timm head is kept (reset only when ``num_classes`` or ``global_pool`` change), so a
    pretrained ImageNet classifier is a SPLIT classifier from the first step.

    Args:
        num_classes: classes; None keeps the timm model's head.
        global_pool: ``token`` (CLS) or ``avg`` (mean of the patch tokens); None keeps the model's.
        label_smoothing: cross-entropy label smoothing.
        **kwargs: `SplitTask` arguments.
    """

    task_name = ClassificationLogic.task_name
    metric_name = ClassificationLogic.metric_name
    model_class = SplitClassifier
    logic_class = ClassificationLogic

    def __init__(
        self,
        num_classes: int | None = ClassificationHeadSettings.num_classes,
        global_pool: str | None = ClassificationHeadSettings.global_pool,
        label_smoothing: float = ClassificationSettings.label_smoothing,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
