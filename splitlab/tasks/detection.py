"""`DetectionTask`: SPLIT object detection with torchvision's Faster / Mask R-CNN heads."""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.detection import MeanAveragePrecision
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign

from splitlab.backbone import PackedFeatures
from splitlab.tasks.base import SplitTask
from splitlab.tasks.dense import (
    SimpleFeaturePyramid,
    check_pyramid_grid,
    default_pyramid_indices,
    pyramid_grids,
    pyramid_scales,
)
from splitlab.tokenizer import TokenLayout

DETECTORS = {"faster_rcnn": FasterRCNN, "mask_rcnn": MaskRCNN}


class _PyramidStub(nn.Module):
    """Stands in for torchvision's backbone: the pyramid comes from the packed ViT instead."""

    def __init__(self, out_channels: int) -> None:
        super().__init__()
        self.out_channels = out_channels

    def forward(self, images: Tensor) -> OrderedDict[str, Tensor]:  # pragma: no cover - never called
        raise RuntimeError("DetectionTask feeds the detector its pyramid directly")


def map_backend() -> str:
    """faster-coco-eval when installed (same numbers, faster), else pycocotools."""
    return "faster_coco_eval" if importlib.util.find_spec("faster_coco_eval") else "pycocotools"


def detection_metrics() -> MetricCollection:
    """COCO box mAP (map, map_50, map_75, ...) with torchmetrics, in the original images' pixels."""
    return MetricCollection(
        {"map": MeanAveragePrecision(iou_type="bbox", box_format="xyxy", backend=map_backend())}
    )


@contextmanager
def heads_in_train_mode(detector: nn.Module) -> Iterator[None]:
    """torchvision computes losses only in training mode; its RPN and RoI heads have no dropout
    or batch norm, so switching them for a loss (also under PPO's frozen model) changes nothing else."""
    modes = [(m, m.training) for m in (detector.rpn, detector.roi_heads)]
    for m, _ in modes:
        m.train()
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


class DetectionTask(SplitTask):
    """Detection: simple feature pyramid + torchvision's RPN and RoI heads (no hand-written NMS or RoIAlign).

    The per-sample loss (PPO's reward) is each image's detection loss: the heads run image by
    image on the batch's pyramid, since torchvision pools its loss normalisers over the batch. In
    PPO the RoI loss is taken on `reference_proposals`, not on the RPN's (see there why).

    Args:
        num_classes: object categories (background excluded).
        detector: ``faster_rcnn`` or ``mask_rcnn``.
        pyramid_channels: channels of the feature pyramid.
        pyramid_indices: blocks feeding the pyramid levels (default: evenly spaced).
        anchor_sizes: one anchor size per pyramid level, in pixels.
        aspect_ratios: anchor aspect ratios.
        representation_size: width of the box head's two-layer MLP.
        detector_kwargs: extra torchvision arguments (``rpn_batch_size_per_image``,
            ``box_detections_per_img``, ...).
        **kwargs: `SplitTask` arguments.
    """

    task_name = "detection"
    metric_name = "map"

    def __init__(
        self,
        num_classes: int = 80,
        detector: str = "faster_rcnn",
        pyramid_channels: int = 256,
        pyramid_indices: Sequence[int] | None = None,
        anchor_sizes: Sequence[int] = (32, 64, 128, 256),
        aspect_ratios: Sequence[float] = (0.5, 1.0, 2.0),
        representation_size: int = 1024,
        detector_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if detector not in DETECTORS:
            raise ValueError(f"detector={detector!r}: expected one of {sorted(DETECTORS)}")
        self.num_classes = num_classes
        self._head_args = (
            detector,
            pyramid_channels,
            pyramid_indices,
            tuple(anchor_sizes),
            tuple(aspect_ratios),
            representation_size,
            detector_kwargs or {},
        )
        super().__init__(**kwargs)

    def configure_head(self) -> nn.Module:
        detector, channels, indices, sizes, ratios, hidden, extra = self._head_args
        self.pyramid_indices = (
            list(indices) if indices is not None else default_pyramid_indices(self.backbone.depth)
        )
        scales = pyramid_scales(self.backbone.patch_size)
        check_pyramid_grid(self.backbone.img_size, self.backbone.patch_size, scales)
        if len(sizes) != len(scales):
            raise ValueError(f"anchor_sizes={list(sizes)}: give one size per pyramid level ({len(scales)})")
        names = [str(i) for i in range(len(scales))]
        size = self.backbone.img_size
        kwargs: dict[str, Any] = {
            "box_head": TwoMLPHead(channels * 7 * 7, hidden),
            "box_predictor": FastRCNNPredictor(hidden, self.num_classes + 1),
            "rpn_anchor_generator": AnchorGenerator(
                tuple((s,) for s in sizes), (tuple(ratios),) * len(sizes)
            ),
            "box_roi_pool": MultiScaleRoIAlign(names, output_size=7, sampling_ratio=2),
            "min_size": size[0],
            "max_size": max(size),
            "image_mean": [0.0, 0.0, 0.0],
            "image_std": [1.0, 1.0, 1.0],
            **extra,
        }
        if detector == "mask_rcnn":
            kwargs["mask_roi_pool"] = MultiScaleRoIAlign(names, output_size=14, sampling_ratio=2)
            kwargs["mask_predictor"] = MaskRCNNPredictor(
                256, 256, self.num_classes + 1
            )  # torchvision's head widths
        heads = nn.ModuleDict(
            {
                "pyramid": SimpleFeaturePyramid(
                    self.backbone.embed_dim, channels, len(self.pyramid_indices), scales
                ),
                "detector": DETECTORS[detector](_PyramidStub(channels), **kwargs),
            }
        )
        return heads

    def backbone_indices(self) -> list[int]:
        return self.pyramid_indices

    # ----------------------------------------------------------------------------- batches
    def split_batch(self, batch: Any) -> tuple[Tensor, list[dict[str, Tensor]]]:
        return batch[0], batch[1]

    def repeat_targets(self, targets: list[dict[str, Tensor]], times: int) -> list[dict[str, Tensor]]:
        return list(targets) * times

    # ----------------------------------------------------------------------------- forward
    def forward_task(self, features: PackedFeatures) -> dict[str, Any]:
        pyramid = self.head["pyramid"](pyramid_grids(features))
        size = features.layout.grid_size
        hw = (size[0] * self.levels.finest, size[1] * self.levels.finest)
        return {"features": pyramid, "image_sizes": [hw] * features.layout.batch_size}

    def _image(self, outputs: dict[str, Any], i: int) -> tuple[OrderedDict[str, Tensor], ImageList]:
        feats = OrderedDict((k, v[i : i + 1]) for k, v in outputs["features"].items())
        h, w = outputs["image_sizes"][i]
        return feats, ImageList(self._canvas(feats, 1, h, w), [(h, w)])

    @staticmethod
    def _canvas(feats: OrderedDict[str, Tensor], batch: int, h: int, w: int) -> Tensor:
        """A stand-in image batch: torchvision's anchor generator reads only its shape."""
        return next(iter(feats.values())).new_zeros(()).expand(batch, 3, h, w)

    def per_sample_loss(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> Tensor:
        detector = self.head["detector"]
        losses = []
        # torchvision's samplers draw from the global RNG; fork it so rewards do not disturb
        # the data order or dropout of a resumed run, and seed it from the policy's generator.
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator, device=self.generator.device))
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), heads_in_train_mode(detector):
            torch.manual_seed(seed)
            for i, target in enumerate(targets):
                feats, images = self._image(outputs, i)
                proposals, rpn_losses = detector.rpn(images, feats, [target])
                if self.stage == "ppo":
                    proposals = [reference_proposals(target["boxes"], images.image_sizes[0])]
                _, roi_losses = detector.roi_heads(feats, proposals, images.image_sizes, [target])
                losses.append(torch.stack([v for v in {**rpn_losses, **roi_losses}.values()]).sum())
        return torch.stack(losses)

    def detect(self, outputs: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Detections per image (boxes in the network's input pixels)."""
        detector = self.head["detector"]
        sizes = outputs["image_sizes"]
        images = ImageList(self._canvas(outputs["features"], len(sizes), *sizes[0]), sizes)
        modes = [(m, m.training) for m in (detector.rpn, detector.roi_heads)]
        for m, _ in modes:
            m.eval()
        try:
            proposals, _ = detector.rpn(images, outputs["features"])
            detections, _ = detector.roi_heads(outputs["features"], proposals, images.image_sizes)
        finally:
            for m, mode in modes:
                m.train(mode)
        return detections

    # ----------------------------------------------------------------------------- metrics
    def build_metrics(self) -> MetricCollection:
        return detection_metrics()

    def update_metrics(
        self,
        metrics: MetricCollection,
        outputs: dict[str, Any],
        targets: list[dict[str, Tensor]],
        layout: TokenLayout,
    ) -> None:
        preds, truth = [], []
        for det, tgt in zip(self.detect(outputs), targets, strict=True):
            scale = float(tgt.get("scale", torch.tensor(1.0)))  # back to the original image's pixels
            preds.append(
                {
                    "boxes": det["boxes"].float() / scale,
                    "scores": det["scores"].float(),
                    "labels": det["labels"],
                }
            )
            truth.append({"boxes": tgt["boxes"].float() / scale, "labels": tgt["labels"]})
        metrics["map"].update(preds, truth)

    def describe_prediction(self, outputs: dict[str, Any], index: int) -> dict[str, Any]:
        det = self.detect(
            {
                "features": OrderedDict((k, v[index : index + 1]) for k, v in outputs["features"].items()),
                "image_sizes": outputs["image_sizes"][index : index + 1],
            }
        )[0]
        keep = det["scores"] > 0.5
        return {
            "boxes": det["boxes"][keep].tolist(),
            "labels": det["labels"][keep].tolist(),
            "scores": det["scores"][keep].tolist(),
        }
