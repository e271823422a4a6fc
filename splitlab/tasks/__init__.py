"""LightningModules: the shared `SplitTask` and one subclass per task."""

from splitlab.tasks.base import STAGES, SplitTask
from splitlab.tasks.classification import ClassificationTask
from splitlab.tasks.detection import DetectionTask
from splitlab.tasks.segmentation import SegmentationTask

__all__ = ["STAGES", "ClassificationTask", "DetectionTask", "SegmentationTask", "SplitTask"]
