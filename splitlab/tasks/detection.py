"""`DetectionTask`: SPLIT object detection with torchvision's Faster / Mask R-CNN heads, and
`DetectionLogic`, its own code (loss, metrics, annotations, data checks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torchmetrics import MetricCollection
from torchvision.models.detection.roi_heads import paste_masks_in_image

from splitlab.heads import DetectorSettings, without_crowd
from splitlab.heads.detection import PER_BOX
from splitlab.metrics import cell_classes, coco_truth, detection_metrics, instance_label_map
from splitlab.model import SplitDetector, SplitModel
from splitlab.model.head_settings import DetectionHeadSettings
from splitlab.tasks.dense import DenseTask
from splitlab.tasks.logic import LossInputs, RunFacts, TaskLogic
from splitlab.tokenizer import TokenLayout

# the score from which a detection of the finest grid is an instance of ``fidelity``'s targets
OWN_SCORE = 0.5


@dataclass(frozen=True)
class DetectionSettings:
    """What detection's code reads of its task's settings (`DetectionLogic` says what each is)."""

    thin_classes: Sequence[int] = ()


class DetectionLogic(TaskLogic):
    """Detection's own code: each image's detection loss, COCO mAP and where the fine tokens go.

    Args:
        model: the task's `SplitDetector` (or a multi-task model's detection member).
        thin_classes: labels (1..K) of thin-structure categories (the hard twin's lines, grids and
            rings): their objects' fine-token coverage is its own column (``thin_fine_coverage``).
    """

    task_name = "detection"
    metric_name = "map"

    settings_class = DetectionSettings

    def __init__(self, model: SplitModel, settings: DetectionSettings) -> None:
        super().__init__(model, settings)
        self.num_classes = model.head_settings.num_classes  # the model's head's
        self.thin_classes = tuple(settings.thin_classes)

    def check_data(self, datamodule: Any, run: RunFacts) -> None:
        """Mask R-CNN learns from instance masks, which the data must load."""
        masks = getattr(datamodule, "hparams", {}).get("masks")
        if self.model.head.settings.name == "mask_rcnn" and masks is False:
            raise ValueError(
                "model.init_args.detector.name=mask_rcnn learns from instance masks, but data.init_args.masks="
                "false loads none: set data.init_args.masks=true (or detector.name: faster_rcnn)"
            )

    def repeat_targets(self, targets: list[dict[str, Tensor]], times: int) -> list[dict[str, Tensor]]:
        return list(targets) * times

    def per_image_loss(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]], inputs: LossInputs
    ) -> Tensor:
        # The heads' samplers are seeded from the policy's generator (resumed runs repeat them), one
        # seed per image id: PPO's rollouts of one image share their draws, so the advantage
        # measures the layout, not the sampling noise.
        generator = inputs.generator
        device = generator.device
        base = torch.randint(0, 2**31 - 1, (1,), generator=generator, device=device)
        ids = torch.stack(
            [t.get("image_id", torch.tensor(i)).to(device).reshape(()) for i, t in enumerate(targets)]
        )
        seeds = (base + 7919 * ids.long()).tolist()  # one host read for the batch, not one per image
        instances = [without_crowd(t) for t in targets]
        return self.head.per_image_loss(outputs, instances, seeds, reference=inputs.reference)

    def own_targets(
        self, reference: dict[str, Any], targets: list[dict[str, Tensor]]
    ) -> list[dict[str, Tensor]]:
        """The finest grid's confident detections (score at least `OWN_SCORE`) as each image's instances;
        where the data gives masks (Mask R-CNN learns them), the detections' own, pasted at its size."""
        own = []
        for det, target in zip(self.head.detect(reference), targets, strict=True):
            keep = det["scores"] >= OWN_SCORE
            instances = {"boxes": det["boxes"][keep].float(), "labels": det["labels"][keep]}
            if "masks" in target and "masks" in det:
                size = tuple(target["masks"].shape[-2:])
                pasted = paste_masks_in_image(det["masks"][keep].float(), instances["boxes"], size)
                instances["masks"] = (pasted[:, 0] > 0.5).to(target["masks"].dtype)
            own.append({**{k: v for k, v in target.items() if k not in PER_BOX}, **instances})
        return own

    def build_metrics(self) -> MetricCollection:
        return detection_metrics(self.finest, self.thin_classes)

    def summary_columns(self) -> list[str]:
        """With thin classes named (the hard twin), the object and thin coverages beside the mAP."""
        return ["object_fine_coverage", "thin_fine_coverage"] if self.thin_classes else []

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
            size = tuple(h * self.finest for h in layout.grid_size)
            maps = [instance_label_map(t["boxes"], t["labels"], size, t.get("masks")) for t in targets]
            metrics["coverage"].update(layout, torch.stack(maps))

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor:
        """The finest cells an object (its mask where loaded, else its box) touches: what the
        coverage metric counts as object cells."""
        _, targets = self.unpack_batch(batch)
        cell = self.finest
        size = (grid[0] * cell, grid[1] * cell)
        maps = [instance_label_map(t["boxes"], t["labels"], size, t.get("masks")) for t in targets]
        return cell_classes(torch.stack(maps), cell, -1, (0,))[0]

    def describe_prediction(self, outputs: dict[str, Any], index: int, target: Any = None) -> dict[str, Any]:
        """The image's detections above 0.5, in the original image's pixels (the letterbox's scale undone)."""
        det = self.head.detect(self.model.one_image(outputs, index))[0]
        keep = det["scores"] > 0.5
        scale = float(target.get("scale", 1.0)) if isinstance(target, dict) else 1.0
        labels = det["labels"][keep].tolist()
        return {
            "boxes": (det["boxes"][keep].float() / scale).tolist(),
            "labels": labels,
            "names": [self.model.name_of(x) for x in labels],
            "scores": det["scores"][keep].tolist(),
        }


class DetectionTask(DenseTask):
    """Detection: simple feature pyramid + torchvision's RPN and RoI heads (`splitlab.heads.DetectionHead`).

    The per-sample loss (PPO's reward) is each image's detection loss. In PPO the RoI loss is taken
    on layout-independent reference proposals, not on the RPN's (see
    `splitlab.heads.reference_proposals` why). The task's own code is `DetectionLogic`'s.

    Args:
        num_classes: object categories (background excluded).
        detector: the torchvision detector, its anchors and box head (`DetectorSettings`).
        thin_classes: labels (1..K) of thin-structure categories (the hard twin's lines, grids and
            rings): their objects' fine-token coverage is its own column (``thin_fine_coverage``).
        **kwargs: `DenseTask` arguments (``pyramid_channels``, ``pyramid_indices``) and `SplitTask`'s.
    """

    task_name = DetectionLogic.task_name
    metric_name = DetectionLogic.metric_name
    model_class = SplitDetector
    logic_class = DetectionLogic
    task_groups = {"detector": DetectorSettings}

    def __init__(
        self,
        num_classes: int = DetectionHeadSettings.num_classes,
        detector: DetectorSettings = DetectorSettings(),
        thin_classes: Sequence[int] = DetectionSettings.thin_classes,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
