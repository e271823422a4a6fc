"""COCO box mAP as pycocotools computes it, wired for splitlab's detection task.

Crowd regions are ignored, not counted as false positives (`coco_truth`), and the fine-token
coverage of objects can be measured beside the mAP (`detection_metrics`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.detection import MeanAveragePrecision

from splitlab.metrics.coverage import FineCoverage


def map_backend() -> str:
    """faster-coco-eval when installed (same numbers, faster), else pycocotools."""
    return "faster_coco_eval" if importlib.util.find_spec("faster_coco_eval") else "pycocotools"


def detection_metrics(cell: int | None = None, thin: Sequence[int] = ()) -> MetricCollection:
    """COCO box mAP (map, map_50, map_75, ...) with torchmetrics, in the original images' pixels;
    with ``cell`` (the finest patch size) also the fine-token coverage of objects and their edges
    (and of the ``thin`` labels' objects, where given)."""
    metrics: dict[str, Any] = {
        "map": MeanAveragePrecision(iou_type="bbox", box_format="xyxy", backend=map_backend())
    }
    if cell is not None:
        metrics["coverage"] = FineCoverage(cell, ignore_index=-1, background=(0,), thin=thin)
    return MetricCollection(metrics, compute_groups=False)


def coco_truth(target: dict[str, Tensor], scale: float = 1.0) -> dict[str, Tensor]:
    """A target as COCO evaluation reads it: boxes in the original image's pixels, and crowd regions
    flagged with their annotated area, so that a detection on a crowd is ignored, not a false
    positive, and small / medium / large go by the annotation's area, as in the official numbers."""
    truth = {"boxes": target["boxes"].float() / scale, "labels": target["labels"]}
    if "iscrowd" in target:
        truth.update(iscrowd=target["iscrowd"], area=target["area"].float())
    return truth
