"""DataModules for the real formats, and (from `splitlab.data.generators`) the generators that write
small datasets in those formats."""

from splitlab.data.classification import ImageClassificationData
from splitlab.data.common import ResumableSampler, SeededIndex, SkipCorrupt
from splitlab.data.detection import CocoDetectionData
from splitlab.data.generators import (
    SHAPE_CLASSES,
    generate_ade20k,
    generate_coco,
    generate_shapes,
    generate_vqa,
)
from splitlab.data.multitask import MultiTaskData
from splitlab.data.segmentation import ADE20KData
from splitlab.data.vqa import VQAv2Data

__all__ = [
    "SHAPE_CLASSES",
    "ADE20KData",
    "CocoDetectionData",
    "ResumableSampler",
    "SeededIndex",
    "ImageClassificationData",
    "MultiTaskData",
    "SkipCorrupt",
    "VQAv2Data",
    "generate_ade20k",
    "generate_coco",
    "generate_shapes",
    "generate_vqa",
]
