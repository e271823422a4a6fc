"""Segmentation head on packed ViT features: simple feature pyramid + mmsegmentation decode heads."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from splitlab.backbone import PackedFeatures
from splitlab.heads.mmseg import build_mmseg_head
from splitlab.heads.pyramid import SimpleFeaturePyramid

UPERNET = {
    "type": "UPerHead",
    "pool_scales": (1, 2, 3, 6),
    "channels": 512,
    "dropout_ratio": 0.1,
    "norm_cfg": {"type": "BN", "requires_grad": True},
    "align_corners": False,
}
ANY_HEAD = {  # what every mmseg decode head takes, for heads other than the two defaults
    "channels": 256,
    "dropout_ratio": 0.1,
    "norm_cfg": {"type": "BN", "requires_grad": True},
    "align_corners": False,
}
# mmseg heads that read every pyramid level themselves (they fix input_transform='multiple_select');
# any other head gets the levels resized and concatenated unless its config says otherwise
MULTI_LEVEL_HEADS = {
    "UPerHead",
    "FPNHead",
    "SegformerHead",
    "LightHamHead",
    "SETRMLAHead",
    "EncHead",
    "ANNHead",
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


def head_config(defaults: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any]:
    """``given`` over ``defaults`` when it names the same head type (or none), else over the settings
    every head takes: UPerHead's pool scales mean nothing to (and break) an FCNHead."""
    given = dict(given or {})
    base = defaults if given.get("type", defaults["type"]) == defaults["type"] else ANY_HEAD
    return {**base, **given}


def pixel_cross_entropy(logits: Tensor, masks: Tensor, ignore_index: int) -> Tensor:
    """Mean pixel cross-entropy per image, ``(B,)``, logits upsampled to the mask size."""
    up = F.interpolate(logits.float(), size=masks.shape[-2:], mode="bilinear", align_corners=False)
    ce = F.cross_entropy(up, masks, ignore_index=ignore_index, reduction="none")
    valid = (masks != ignore_index).to(ce.dtype)
    return (ce * valid).flatten(1).sum(1) / valid.flatten(1).sum(1).clamp(min=1.0)


class SegmentationHead(nn.Module):
    """Feature pyramid + an mmseg decode head (UPerHead by default) and an optional auxiliary head.

    Any mmseg decode head can be named by its registry dict (``decode_head: {type: ...}``); its
    ``num_classes`` is filled in, and ``in_channels`` and ``in_index`` (every pyramid level, resized
    and concatenated for single-input heads such as FCNHead or ASPPHead) unless given.

    Args:
        pyramid: the feature pyramid (`SimpleFeaturePyramid.for_backbone`).
        num_classes: classes.
        decode_head: mmseg head config overriding UPerHead's defaults.
        auxiliary_head: mmseg head config for an auxiliary head (``{}`` for an FCN head on level 2),
            or None for none.
    """

    def __init__(
        self,
        pyramid: SimpleFeaturePyramid,
        num_classes: int,
        decode_head: dict[str, Any] | None = None,
        auxiliary_head: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.pyramid = pyramid
        channels, levels = pyramid.out_channels, len(pyramid.scales)
        decode = head_config(UPERNET, decode_head)
        decode.update(num_classes=num_classes)
        decode.setdefault("in_index", list(range(levels)))
        if isinstance(decode["in_index"], int):
            decode.setdefault("in_channels", channels)
        else:
            decode.setdefault("in_channels", [channels] * len(decode["in_index"]))
            if decode["type"] not in MULTI_LEVEL_HEADS:
                decode.setdefault("input_transform", "resize_concat")
        self.decode = build_mmseg_head(decode, "model.init_args.decode_head")
        if auxiliary_head is not None:
            aux = head_config(FCN_AUX, auxiliary_head)
            aux.update(num_classes=num_classes)
            aux.setdefault("in_index", FCN_AUX["in_index"])
            aux.setdefault("in_channels", channels)
            self.aux = build_mmseg_head(aux, "model.init_args.auxiliary_head")
        else:
            self.aux = None

    def forward(self, features: PackedFeatures) -> dict[str, Tensor]:
        """``logits`` at stride 4 (and ``aux`` logits while training)."""
        return self.from_pyramid(self.pyramid.forward_packed(features))

    def from_pyramid(
        self, pyramid: OrderedDict[str, Tensor], size: Sequence[int] | None = None
    ) -> dict[str, Tensor]:
        """The decode head (and the auxiliary one while training) on a pyramid of any source (packed
        tokens, or timm's uniform grid in `DenseModel.forward_uniform`); ``size`` is the detector's."""
        inputs = list(pyramid.values())
        out = {"logits": self.decode(inputs)}
        if self.aux is not None and self.training:
            out["aux"] = self.aux(inputs)
        return out

    def per_image_loss(
        self, outputs: dict[str, Tensor], masks: Tensor, ignore_index: int, aux_weight: float
    ) -> Tensor:
        """Each image's mean pixel cross-entropy (plus ``aux_weight`` times the auxiliary head's), ``(B,)``."""
        loss = pixel_cross_entropy(outputs["logits"], masks, ignore_index)
        if "aux" in outputs:
            loss = loss + aux_weight * pixel_cross_entropy(outputs["aux"], masks, ignore_index)
        return loss

    @staticmethod
    def predict_masks(outputs: dict[str, Tensor], size: Sequence[int]) -> Tensor:
        """``(B, H, W)`` class predictions at ``size``."""
        return F.interpolate(
            outputs["logits"].float(), size=tuple(size), mode="bilinear", align_corners=False
        ).argmax(1)
