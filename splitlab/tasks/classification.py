"""`ClassificationTask`: SPLIT image classification with timm's own head."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from splitlab.backbone import PackedFeatures
from splitlab.tasks.base import SplitTask
from splitlab.tokenizer import TokenLayout


class ClassificationTask(SplitTask):
    """Classification: the timm model's head (CLS token or mean pool), per-image cross-entropy.

    The timm head is kept (reset only when ``num_classes`` or ``global_pool`` change), so a
    pretrained ImageNet classifier is a SPLIT classifier from the first step.

    Args:
        num_classes: classes; None keeps the timm model's head.
        global_pool: ``token`` (CLS) or ``avg`` (mean of the patch tokens); None keeps the model's.
        label_smoothing: cross-entropy label smoothing.
        **kwargs: `SplitTask` arguments.
    """

    task_name = "classification"
    metric_name = "top1"

    def __init__(
        self,
        num_classes: int | None = None,
        global_pool: str | None = None,
        label_smoothing: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)

    def configure_head(self) -> None:
        model, hp = self.backbone.model, self.hparams
        pool = hp.global_pool or model.global_pool
        if pool not in ("token", "avg"):
            raise ValueError(f"global_pool={pool!r}: expected 'token' or 'avg'")
        classes = hp.num_classes if hp.num_classes is not None else model.num_classes
        if classes != model.num_classes or pool != model.global_pool:
            model.reset_classifier(classes, pool)
        if model.num_classes < 1:
            raise ValueError(f"backbone {self.hparams.backbone!r} has no classifier: set num_classes")
        return None

    @property
    def num_classes(self) -> int:
        return int(self.backbone.model.num_classes)

    def build_metrics(self) -> MetricCollection:
        classes = self.backbone.model.num_classes
        return MetricCollection(
            {
                "top1": MulticlassAccuracy(classes, top_k=1, average="micro"),
                "top5": MulticlassAccuracy(classes, top_k=min(5, classes), average="micro"),
            }
        )

    def forward_task(self, features: PackedFeatures) -> Tensor:
        return self.backbone.forward_head(features)

    def per_sample_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(
            outputs.float(), targets, reduction="none", label_smoothing=self.hparams.label_smoothing
        )

    def update_metrics(
        self, metrics: MetricCollection, outputs: Tensor, targets: Tensor, layout: TokenLayout
    ) -> None:
        metrics.update(outputs.float(), targets)

    def describe_prediction(self, outputs: Tensor, index: int) -> dict[str, Any]:
        probs = outputs[index].float().softmax(-1)
        return {"class": int(probs.argmax()), "probability": float(probs.max())}
