"""DataModules for the real formats, and generators that write small datasets in those formats."""

from splitlab.data.classification import ImageClassificationData
from splitlab.data.common import EpochShuffleSampler, SkipCorrupt
from splitlab.data.shapes import CLASSES as SHAPE_CLASSES
from splitlab.data.shapes import generate_shapes

__all__ = [
    "SHAPE_CLASSES",
    "EpochShuffleSampler",
    "ImageClassificationData",
    "SkipCorrupt",
    "generate_shapes",
]
