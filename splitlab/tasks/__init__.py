"""LightningModules: the shared `SplitTask` and one subclass per task."""

from splitlab.tasks.base import STAGES, SplitTask
from splitlab.tasks.classification import ClassificationTask

__all__ = ["STAGES", "ClassificationTask", "SplitTask"]
