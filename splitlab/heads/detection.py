"""Detection head on packed ViT features: simple feature pyramid + torchvision's Faster / Mask R-CNN heads.

Plain PyTorch: usable from any training loop. torchvision supplies the RPN, RoIAlign, box and
mask heads, NMS and the losses; the pyramid comes from the packed backbone instead of a CNN.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign

from splitlab.backbone import PackedFeatures
from splitlab.heads.pyramid import SimpleFeaturePyramid

DETECTORS = {"faster_rcnn": FasterRCNN, "mask_rcnn": MaskRCNN}


@dataclass(frozen=True)
class DetectorSettings:
    """The torchvision detector a `DetectionHead` builds on the pyramid, declared here once: the
    detection task takes it whole (``model.init_args.detector``), config.json keeps it as a mapping.

    Args:
        name: ``faster_rcnn`` or ``mask_rcnn`` (which learns from instance masks).
        anchor_sizes: one anchor size per pyramid level, in pixels.
        aspect_ratios: anchor aspect ratios.
        representation_size: width of the box head's two-layer MLP.
        torchvision_kwargs: further torchvision arguments (``rpn_batch_size_per_image``,
            ``box_detections_per_img``, ...).
    """

    name: str = "faster_rcnn"
    anchor_sizes: tuple[int, ...] = (32, 64, 128, 256)
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    representation_size: int = 1024
    torchvision_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in DETECTORS:
            raise ValueError(f"detector.name={self.name!r}: expected one of {sorted(DETECTORS)}")
        # a recipe's lists, as the frozen value's tuples
        object.__setattr__(self, "anchor_sizes", tuple(int(s) for s in self.anchor_sizes))
        object.__setattr__(self, "aspect_ratios", tuple(float(r) for r in self.aspect_ratios))
        object.__setattr__(self, "torchvision_kwargs", dict(self.torchvision_kwargs or {}))


class PyramidStub(nn.Module):
    """Stands in for torchvision's backbone: the pyramid comes from the packed ViT instead."""

    def __init__(self, out_channels: int) -> None:
        super().__init__()
        self.out_channels = out_channels

    def forward(self, images: Tensor) -> OrderedDict[str, Tensor]:  # pragma: no cover - never called
        raise RuntimeError("DetectionHead feeds the detector its pyramid directly")


PER_BOX = ("boxes", "labels", "masks", "iscrowd", "area")


def without_crowd(target: dict[str, Tensor]) -> dict[str, Tensor]:
    """The instances a detector learns from: COCO's crowd regions (``iscrowd``) are not instances."""
    if "iscrowd" not in target:
        return target
    keep = target["iscrowd"] == 0
    return {k: v[keep] if k in PER_BOX else v for k, v in target.items()}


@contextmanager
def heads_in_train_mode(detector: nn.Module, training: bool = True) -> Iterator[None]:
    """Switch torchvision's RPN and RoI heads to train (losses) or eval (detections) for a block.

    torchvision computes losses only in training mode; its RPN and RoI heads have no dropout or
    batch norm, so switching them (also under PPO's frozen model) changes nothing else.
    """
    modes = [(m, m.training) for m in (detector.rpn, detector.roi_heads)]
    for m, _ in modes:
        m.train(training)
    try:
        yield
    finally:
        for m, mode in modes:
            m.train(mode)


def reference_proposals(
    boxes: Tensor, size: tuple[int, int], jitter: int = 8, background: int = 32
) -> Tensor:
    """Layout-independent RoI proposals for the PPO reward: jittered copies of the ground truth plus
    random boxes (from the current, forked and seeded, global RNG).

    With the RPN's own proposals a policy can *lower* the RoI loss by degrading them: fewer good
    proposals leave mostly easy negatives. Scoring every rollout on the same kind of proposals
    makes the reward measure the features, not the proposal count.
    """
    h, w = size
    out = [boxes]
    if boxes.numel():
        wh = (boxes[:, 2:] - boxes[:, :2]).repeat(jitter, 1)
        shift = (torch.rand(wh.shape[0], 4, device=boxes.device) - 0.5) * 0.3 * wh.repeat(1, 2)
        out.append(boxes.repeat(jitter, 1) + shift)
    centre = torch.rand(background, 2, device=boxes.device) * torch.tensor([w, h], device=boxes.device)
    half = (0.05 + 0.3 * torch.rand(background, 2, device=boxes.device)) * torch.tensor(
        [w, h], device=boxes.device
    )
    out.append(torch.cat([centre - half, centre + half], 1))
    props = torch.cat(out).float()
    props[:, 0::2] = props[:, 0::2].clamp(0, w)
    props[:, 1::2] = props[:, 1::2].clamp(0, h)
    keep = (props[:, 2] - props[:, 0] >= 1) & (props[:, 3] - props[:, 1] >= 1)
    return props[keep]


class DetectionHead(nn.Module):
    """Feature pyramid + torchvision RPN and RoI heads (no hand-written NMS or RoIAlign).

    Args:
        pyramid: the feature pyramid (`SimpleFeaturePyramid.for_backbone`).
        num_classes: object categories (background excluded).
        img_size: network input size ``(H, W)`` (fixes torchvision's resize to a no-op).
        settings: the detector (`DetectorSettings`; a mapping of its fields is read as one).
    """

    def __init__(
        self,
        pyramid: SimpleFeaturePyramid,
        num_classes: int,
        img_size: tuple[int, int],
        settings: DetectorSettings | dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(settings, DetectorSettings):
            settings = DetectorSettings(**(settings or {}))
        self.settings = settings
        anchor_sizes, representation_size = settings.anchor_sizes, settings.representation_size
        levels = len(pyramid.scales)
        if len(anchor_sizes) != levels:
            raise ValueError(
                f"detector.anchor_sizes={list(anchor_sizes)}: give one size per pyramid level ({levels})"
            )
        channels = pyramid.out_channels
        names = [str(i) for i in range(levels)]
        kwargs: dict[str, Any] = {
            "box_head": TwoMLPHead(channels * 7 * 7, representation_size),
            "box_predictor": FastRCNNPredictor(representation_size, num_classes + 1),
            "rpn_anchor_generator": AnchorGenerator(
                tuple((s,) for s in anchor_sizes), (settings.aspect_ratios,) * levels
            ),
            "box_roi_pool": MultiScaleRoIAlign(names, output_size=7, sampling_ratio=2),
            "min_size": img_size[0],
            "max_size": max(img_size),
            "image_mean": [0.0, 0.0, 0.0],
            "image_std": [1.0, 1.0, 1.0],
            **settings.torchvision_kwargs,
        }
        if settings.name == "mask_rcnn":  # torchvision's head widths
            kwargs["mask_roi_pool"] = MultiScaleRoIAlign(names, output_size=14, sampling_ratio=2)
            kwargs["mask_predictor"] = MaskRCNNPredictor(256, 256, num_classes + 1)
        self.pyramid = pyramid
        self.detector = DETECTORS[settings.name](PyramidStub(channels), **kwargs)

    def forward(self, features: PackedFeatures) -> dict[str, Any]:
        """The pyramid and the input size of every image (all images share the network's size)."""
        layout = features.layout
        size = layout.grid_size
        hw = (size[0] * layout.levels.finest, size[1] * layout.levels.finest)
        return self.from_pyramid(self.pyramid.forward_packed(features), hw)

    @staticmethod
    def from_pyramid(pyramid: OrderedDict[str, Tensor], size: Sequence[int]) -> dict[str, Any]:
        """What `detect` and `per_image_loss` read, from a pyramid of any source (packed tokens, or
        timm's uniform grid in `DenseModel.forward_uniform`) for inputs of ``size`` (H, W)."""
        batch = next(iter(pyramid.values())).shape[0]
        return {"features": pyramid, "image_sizes": [tuple(size)] * batch}

    @contextmanager
    def _full_precision(self, outputs: dict[str, Any]) -> Iterator[OrderedDict[str, Tensor]]:
        """The pyramid in the heads' own dtype, with autocast off, for a block.

        Under ``bf16-mixed`` the RPN and box predictor would return bf16 deltas, and torchvision
        decodes boxes in its deltas' dtype: at 1024 px, bf16 coordinates step by 4 px (8 above
        1024), which costs AP75 and small objects. The heads are a small share of the work.
        """
        feats = outputs["features"]
        dtype = next(self.detector.parameters()).dtype  # float32, or the sharded model's own
        device = next(iter(feats.values())).device
        with torch.autocast(device.type, enabled=False):
            yield OrderedDict((k, v.to(dtype)) for k, v in feats.items())

    @staticmethod
    def _canvas(feats: OrderedDict[str, Tensor], batch: int, h: int, w: int) -> Tensor:
        """A stand-in image batch: torchvision's anchor generator reads only its shape."""
        return next(iter(feats.values())).new_zeros(()).expand(batch, 3, h, w)

    def per_image_loss(
        self,
        outputs: dict[str, Any],
        targets: Sequence[dict[str, Tensor]],
        seeds: Sequence[int],
        reference: bool = False,
    ) -> Tensor:
        """Each image's detection loss (RPN + RoI), ``(B,)``.

        The heads run image by image, since torchvision pools its loss normalisers over the batch.
        Its samplers (anchor and RoI sampling, reference proposals) draw from the global RNG: that
        stream is forked, and reseeded with each image's seed, so losses do not disturb the data
        order or dropout of a run, and rows with the same seed (PPO's rollouts of one image) see
        the same random draws: their losses differ by their layouts only.

        Args:
            outputs: `forward`'s result.
            targets: per image ``boxes`` (xyxy, input pixels), ``labels`` and optional ``masks``.
            seeds: one seed per image for the samplers' random draws.
            reference: take the RoI loss on `reference_proposals` instead of the RPN's (PPO).
        """
        detector = self.detector
        losses = []
        device = next(iter(outputs["features"].values())).device
        devices = [device] if device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=devices),
            heads_in_train_mode(detector),
            self._full_precision(outputs) as pyramid,
        ):
            for i, (target, seed) in enumerate(zip(targets, seeds, strict=True)):
                torch.manual_seed(int(seed))
                feats = OrderedDict((k, v[i : i + 1]) for k, v in pyramid.items())
                h, w = outputs["image_sizes"][i]
                images = ImageList(self._canvas(feats, 1, h, w), [(h, w)])
                proposals, rpn_losses = detector.rpn(images, feats, [target])
                if reference:
                    proposals = [reference_proposals(target["boxes"], (h, w))]
                _, roi_losses = detector.roi_heads(feats, proposals, images.image_sizes, [target])
                losses.append(torch.stack([v for v in {**rpn_losses, **roi_losses}.values()]).sum())
        return torch.stack(losses)

    def detect(self, outputs: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Detections per image (boxes in the network's input pixels)."""
        sizes = outputs["image_sizes"]
        with heads_in_train_mode(self.detector, training=False), self._full_precision(outputs) as feats:
            images = ImageList(self._canvas(feats, len(sizes), *sizes[0]), sizes)
            proposals, _ = self.detector.rpn(images, feats)
            detections, _ = self.detector.roi_heads(feats, proposals, images.image_sizes)
        return detections
