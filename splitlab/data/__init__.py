"""DataModules for the real formats, and generators that write small datasets in those formats."""

from splitlab.data.classification import ImageClassificationData
from splitlab.data.common import ResumableSampler, SeededIndex, SkipCorrupt
from splitlab.data.detection import CocoDetectionData
from splitlab.data.scenes import generate_ade20k, generate_coco
from splitlab.data.segmentation import ADE20KData
from splitlab.data.shapes import CLASSES as SHAPE_CLASSES
from splitlab.data.shapes import generate_shapes
from splitlab.data.vqa import VQAv2Data
from splitlab.data.vqa_scenes import generate_vqa

__all__ = [
    "SHAPE_CLASSES",
    "ADE20KData",
    "CocoDetectionData",
    "ResumableSampler",
    "SeededIndex",
    "ImageClassificationData",
    "SkipCorrupt",
    "VQAv2Data",
    "generate_ade20k",
    "generate_coco",
    "generate_shapes",
    "generate_vqa",
]
