"""`SegmentationTask`: SPLIT semantic segmentation with mmsegmentation decode heads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from splitlab.heads import SegmentationHead
from splitlab.metrics import FineCoverage
from splitlab.tasks.dense import DenseTask
from splitlab.tokenizer import TokenLayout


class SegmentationTask(DenseTask):
    """Semantic segmentation: simple feature pyramid + an mmseg decode head (`splitlab.heads.SegmentationHead`).

    The per-sample loss is each image's mean pixel cross-entropy (plus ``aux_weight`` times the
    auxiliary head's). Besides mIoU it reports where the fine tokens go (`FineCoverage`).

    Args:
        num_classes: classes (150 for ADE20K).
        decode_head: mmseg head config overriding UPerHead's defaults.
        auxiliary_head: mmseg head config for an auxiliary head (``{}`` for an FCN head on
            level 2), or None for none.
        aux_weight: weight of the auxiliary loss.
        ignore_index: unlabelled pixels.
        background_classes: classes that are not objects, for the fine-coverage metric.
        **kwargs: `DenseTask` arguments (``pyramid_channels``, ``pyramid_indices``) and `SplitTask`'s.
    """

    task_name = "segmentation"
    metric_name = "miou"

    def __init__(
        self,
        num_classes: int = 150,
        decode_head: dict[str, Any] | None = None,
        auxiliary_head: dict[str, Any] | None = None,
        aux_weight: float = 0.4,
        ignore_index: int = 255,
        background_classes: Sequence[int] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)

    def configure_head(self) -> SegmentationHead:
        hp = self.hparams
        outside = [c for c in hp.background_classes if not 0 <= c < hp.num_classes]
        if outside:
            raise ValueError(f"background_classes {outside} are not classes of num_classes={hp.num_classes}")
        return SegmentationHead(self.build_pyramid(), hp.num_classes, hp.decode_head, hp.auxiliary_head)

    def per_sample_loss(self, outputs: dict[str, Tensor], targets: Tensor) -> Tensor:
        return self.head.per_image_loss(outputs, targets, self.hparams.ignore_index, self.hparams.aux_weight)

    def build_metrics(self) -> MetricCollection:
        hp = self.hparams
        return MetricCollection(
            {
                "miou": MulticlassJaccardIndex(hp.num_classes, ignore_index=hp.ignore_index, average="macro"),
                "pixel_accuracy": MulticlassAccuracy(
                    hp.num_classes, ignore_index=hp.ignore_index, average="micro"
                ),
                "coverage": FineCoverage(self.levels.finest, hp.ignore_index, hp.background_classes),
            },
            compute_groups=False,
        )

    def update_metrics(
        self, metrics: MetricCollection, outputs: dict[str, Tensor], targets: Tensor, layout: TokenLayout
    ) -> None:
        preds = self.head.predict_masks(outputs, targets.shape[-2:])
        metrics["miou"].update(preds, targets)
        metrics["pixel_accuracy"].update(preds, targets)
        metrics["coverage"].update(layout, targets)

    def describe_prediction(self, outputs: dict[str, Tensor], index: int) -> dict[str, Any]:
        classes = outputs["logits"][index].argmax(0).unique().tolist()
        return {"classes_present": classes}
