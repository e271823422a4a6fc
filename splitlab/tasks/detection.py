"""`DetectionTask`: SPLIT object detection with torchvision's Faster / Mask R-CNN heads."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import MetricCollection

from splitlab.heads import DetectionHead, without_crowd
from splitlab.metrics import coco_truth, detection_metrics, instance_label_map
from splitlab.tasks.dense import DenseTask
from splitlab.tokenizer import TokenLayout


class DetectionTask(DenseTask):
    """Detection: simple feature pyramid + torchvision's RPN and RoI heads (`splitlab.heads.DetectionHead`).

    The per-sample loss (PPO's reward) is each image's detection loss. In PPO the RoI loss is taken
    on layout-independent reference proposals, not on the RPN's (see
    `splitlab.heads.reference_proposals` why).

    Args:
        num_classes: object categories (background excluded).
        detector: ``faster_rcnn`` or ``mask_rcnn``.
        anchor_sizes: one anchor size per pyramid level, in pixels.
        aspect_ratios: anchor aspect ratios.
        representation_size: width of the box head's two-layer MLP.
        detector_kwargs: extra torchvision arguments (``rpn_batch_size_per_image``,
            ``box_detections_per_img``, ...).
        **kwargs: `DenseTask` arguments (``pyramid_channels``, ``pyramid_indices``) and `SplitTask`'s.
    """

    task_name = "detection"
    metric_name = "map"

    def __init__(
        self,
        num_classes: int = 80,
        detector: str = "faster_rcnn",
        anchor_sizes: Sequence[int] = (32, 64, 128, 256),
        aspect_ratios: Sequence[float] = (0.5, 1.0, 2.0),
        representation_size: int = 1024,
        detector_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)

    def configure_head(self) -> DetectionHead:
        hp = self.hparams
        patch = self.backbone.patch_size
        if patch & (patch - 1):
            raise ValueError(
                f"a {patch}-px patch gives pyramid strides {patch / 4:g}-{patch * 2:g} px, but torchvision's "
                "RoIAlign and anchors assume powers of two (boxes would be read 12% off): set "
                "model.init_args.backbone_kwargs.patch_size=16 (timm resamples the patch embedding)"
            )
        return DetectionHead(
            self.build_pyramid(),
            hp.num_classes,
            self.backbone.img_size,
            hp.detector,
            hp.anchor_sizes,
            hp.aspect_ratios,
            hp.representation_size,
            hp.detector_kwargs,
        )

    def repeat_targets(self, targets: list[dict[str, Tensor]], times: int) -> list[dict[str, Tensor]]:
        return list(targets) * times

    def per_sample_loss(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> Tensor:
        # The heads' samplers are seeded from the policy's generator (resumed runs repeat them), one
        # seed per image id: PPO's rollouts of one image share their draws, so the advantage
        # measures the layout, not the sampling noise.
        device = self.generator.device
        base = torch.randint(0, 2**31 - 1, (1,), generator=self.generator, device=device)
        ids = torch.stack(
            [t.get("image_id", torch.tensor(i)).to(device).reshape(()) for i, t in enumerate(targets)]
        )
        seeds = (base + 7919 * ids.long()).tolist()  # one host read for the batch, not one per image
        instances = [without_crowd(t) for t in targets]
        return self.head.per_image_loss(outputs, instances, seeds, reference=self.stage == "ppo")

    def build_metrics(self) -> MetricCollection:
        return detection_metrics(self.levels.finest)

    def update_metrics(
        self,
        metrics: MetricCollection,
        outputs: dict[str, Any],
        targets: list[dict[str, Tensor]],
        layout: TokenLayout,
    ) -> None:
        preds, truth = [], []
        for det, tgt in zip(self.head.detect(outputs), targets, strict=True):
            scale = float(tgt.get("scale", torch.tensor(1.0)))  # back to the original image's pixels
            preds.append(
                {
                    "boxes": det["boxes"].float() / scale,
                    "scores": det["scores"].float(),
                    "labels": det["labels"],
                }
            )
            truth.append(coco_truth(tgt, scale))
        metrics["map"].update(preds, truth)
        if "coverage" in metrics:  # where the fine tokens go: on the objects (masks, else boxes)?
            size = tuple(h * self.levels.finest for h in layout.grid_size)
            maps = [instance_label_map(t["boxes"], t["labels"], size, t.get("masks")) for t in targets]
            metrics["coverage"].update(layout, torch.stack(maps))

    def describe_prediction(self, outputs: dict[str, Any], index: int) -> dict[str, Any]:
        one = {
            "features": OrderedDict((k, v[index : index + 1]) for k, v in outputs["features"].items()),
            "image_sizes": outputs["image_sizes"][index : index + 1],
        }
        det = self.head.detect(one)[0]
        keep = det["scores"] > 0.5
        return {
            "boxes": det["boxes"][keep].tolist(),
            "labels": det["labels"][keep].tolist(),
            "scores": det["scores"][keep].tolist(),
        }
