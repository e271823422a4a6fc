"""Metrics splitlab adds to torchmetrics: where the fine tokens go, and per-policy statistics.

`FineCoverage` measures allocation (the paper's object / boundary coverage); `detection_metrics`
is COCO box mAP as pycocotools computes it (crowd regions ignored: `coco_truth`); `PolicyStats` wraps a
task's metrics with the token fraction and throughput of one layout policy, as the comparison
table reports them, timed with `timed`. `VQAAccuracy` is the VQAv2 answer accuracy, overall and per
answer and question type, with the answer normalisation of today's official script (the evaluation
server's), its 2016 version or lmms-eval (`VQA_MODES`). One module per family; every name is
importable from here.
"""

from splitlab.metrics.coverage import FineCoverage, cell_classes, instance_label_map
from splitlab.metrics.detection import coco_truth, detection_metrics, map_backend
from splitlab.metrics.policy import PolicyStats
from splitlab.metrics.timing import interleaved, pair_spread, synchronize, timed
from splitlab.metrics.vqa import (
    ANSWERS_PER_QUESTION,
    VQA_ANSWER_TYPES,
    VQA_MODES,
    VQAAccuracy,
    check_vqa_mode,
    normalize_answer,
    vqa_score,
)

__all__ = [
    "ANSWERS_PER_QUESTION",
    "VQA_ANSWER_TYPES",
    "VQA_MODES",
    "FineCoverage",
    "PolicyStats",
    "VQAAccuracy",
    "cell_classes",
    "check_vqa_mode",
    "coco_truth",
    "detection_metrics",
    "instance_label_map",
    "interleaved",
    "map_backend",
    "normalize_answer",
    "pair_spread",
    "synchronize",
    "timed",
    "vqa_score",
]
