"""The `SplitTask` template and one thin LightningModule per task, each holding its task's own code
as a plain `TaskLogic`."""

from splitlab.tasks.base import SplitTask
from splitlab.tasks.classification import ClassificationTask
from splitlab.tasks.dense import DenseTask
from splitlab.tasks.detection import DetectionTask
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.multitask import MultiTaskSplit
from splitlab.tasks.segmentation import SegmentationTask
from splitlab.tasks.state import load_task, read_checkpoint
from splitlab.tasks.vqa import VQATask
from splitlab.training.progress import STAGES

__all__ = [
    "STAGES",
    "ClassificationTask",
    "DenseTask",
    "DetectionTask",
    "MultiTaskSplit",
    "SegmentationTask",
    "SplitTask",
    "TaskLogic",
    "VQATask",
    "load_task",
    "read_checkpoint",
]
