"""`SegmentationTask`: SPLIT semantic segmentation with mmsegmentation decode heads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from splitlab.backbone import PackedFeatures
from splitlab.tasks.base import SplitTask
from splitlab.tasks.dense import (
    SimpleFeaturePyramid,
    check_pyramid_grid,
    default_pyramid_indices,
    pyramid_grids,
    pyramid_scales,
)
from splitlab.tasks.metrics import FineCoverage
from splitlab.tasks.mmseg_compat import import_mmseg
from splitlab.tokenizer import TokenLayout

UPERNET = {
    "type": "UPerHead",
    "pool_scales": (1, 2, 3, 6),
    "channels": 512,
    "dropout_ratio": 0.1,
    "norm_cfg": {"type": "BN", "requires_grad": True},
    "align_corners": False,
}
FCN_AUX = {
    "type": "FCNHead",
    "in_index": 2,
    "channels": 256,
    "num_convs": 1,
    "concat_input": False,
    "dropout_ratio": 0.1,
    "norm_cfg": {"type": "BN", "requires_grad": True},
    "align_corners": False,
}


def pixel_cross_entropy(logits: Tensor, masks: Tensor, ignore_index: int) -> Tensor:
    """Mean pixel cross-entropy per image, ``(B,)``, logits upsampled to the mask size."""
    up = F.interpolate(logits.float(), size=masks.shape[-2:], mode="bilinear", align_corners=False)
    ce = F.cross_entropy(up, masks, ignore_index=ignore_index, reduction="none")
    valid = (masks != ignore_index).to(ce.dtype)
    return (ce * valid).flatten(1).sum(1) / valid.flatten(1).sum(1).clamp(min=1.0)


class SegmentationTask(SplitTask):
    """Semantic segmentation: simple feature pyramid + an mmseg decode head (UPerHead by default).

    Any mmseg decode head can be named by its registry dict (``decode_head: {type: ...}``); its
    ``in_channels``, ``in_index`` and ``num_classes`` are filled in. The per-sample loss is each
    image's mean pixel cross-entropy (plus ``aux_weight`` times the auxiliary head's).

    Args:
        num_classes: classes (150 for ADE20K).
        decode_head: mmseg head config overriding UPerHead's defaults.
        auxiliary_head: mmseg head config for an auxiliary head (``{}`` for an FCN head on
            level 2), or None for none.
        aux_weight: weight of the auxiliary loss.
        pyramid_channels: channels of the feature pyramid.
        pyramid_indices: blocks feeding the four pyramid levels (default: evenly spaced).
        ignore_index: unlabelled pixels.
        background_classes: classes that are not objects, for the fine-coverage metric.
        **kwargs: `SplitTask` arguments.
    """

    task_name = "segmentation"
    metric_name = "miou"

    def __init__(
        self,
        num_classes: int = 150,
        decode_head: dict[str, Any] | None = None,
        auxiliary_head: dict[str, Any] | None = None,
        aux_weight: float = 0.4,
        pyramid_channels: int = 256,
        pyramid_indices: Sequence[int] | None = None,
        ignore_index: int = 255,
        background_classes: Sequence[int] = (),
        **kwargs: Any,
    ) -> None:
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self._head_args = (decode_head, auxiliary_head, pyramid_channels, pyramid_indices)
        super().__init__(**kwargs)

    def configure_head(self) -> nn.Module:
        decode_head, auxiliary_head, channels, indices = self._head_args
        models = import_mmseg()
        self.pyramid_indices = (
            list(indices) if indices is not None else default_pyramid_indices(self.backbone.depth)
        )
        scales = pyramid_scales(self.backbone.patch_size)
        check_pyramid_grid(self.backbone.img_size, self.backbone.patch_size, scales)
        pyramid = SimpleFeaturePyramid(self.backbone.embed_dim, channels, len(self.pyramid_indices), scales)
        heads = nn.ModuleDict({"pyramid": pyramid})
        levels = len(heads["pyramid"].scales)
        decode = {**UPERNET, **(decode_head or {})}
        decode.update(
            in_channels=[channels] * levels, in_index=list(range(levels)), num_classes=self.num_classes
        )
        heads["decode"] = models.build(decode)
        if auxiliary_head is not None:
            aux = {**FCN_AUX, **auxiliary_head}
            aux.update(in_channels=channels, num_classes=self.num_classes)
            heads["aux"] = models.build(aux)
        return heads

    def backbone_indices(self) -> list[int]:
        return self.pyramid_indices

    def forward_task(self, features: PackedFeatures) -> dict[str, Tensor]:
        inputs = list(self.head["pyramid"](pyramid_grids(features)).values())
        out = {"logits": self.head["decode"](inputs)}
        if "aux" in self.head and self.training:
            out["aux"] = self.head["aux"](inputs)
        return out

    def per_sample_loss(self, outputs: dict[str, Tensor], targets: Tensor) -> Tensor:
        loss = pixel_cross_entropy(outputs["logits"], targets, self.ignore_index)
        if "aux" in outputs:
            loss = loss + self.hparams.aux_weight * pixel_cross_entropy(
                outputs["aux"], targets, self.ignore_index
            )
        return loss

    def build_metrics(self) -> MetricCollection:
        return MetricCollection(
            {
                "miou": MulticlassJaccardIndex(
                    self.num_classes, ignore_index=self.ignore_index, average="macro"
                ),
                "pixel_accuracy": MulticlassAccuracy(
                    self.num_classes, ignore_index=self.ignore_index, average="micro"
                ),
                "coverage": FineCoverage(
                    self.levels.finest, self.ignore_index, self.hparams.background_classes
                ),
            },
            compute_groups=False,
        )

    def predict_masks(self, outputs: dict[str, Tensor], size: Sequence[int]) -> Tensor:
        """``(B, H, W)`` class predictions at ``size``."""
        return F.interpolate(
            outputs["logits"].float(), size=tuple(size), mode="bilinear", align_corners=False
        ).argmax(1)

    def update_metrics(
        self, metrics: MetricCollection, outputs: dict[str, Tensor], targets: Tensor, layout: TokenLayout
    ) -> None:
        preds = self.predict_masks(outputs, targets.shape[-2:])
        metrics["miou"].update(preds, targets)
        metrics["pixel_accuracy"].update(preds, targets)
        metrics["coverage"].update(layout, targets)

    def describe_prediction(self, outputs: dict[str, Tensor], index: int) -> dict[str, Any]:
        classes = outputs["logits"][index].argmax(0).unique().tolist()
        return {"classes_present": classes}
