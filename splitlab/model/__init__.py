"""The deployable SPLIT model: `SplitModel` (one plain torch module per task), `load`, preprocessing.

No Lightning here: ``splitlab.load(path)`` gives a model that predicts on image files, saves in the
Hugging Face layout and exports, whatever trained it.
"""

from splitlab.model.base import POLICIES, SplitModel
from splitlab.model.load import load
from splitlab.model.multitask import SplitMultiTask
from splitlab.model.preprocess import PadTo, Placement, Preprocessing
from splitlab.model.tasks import SplitClassifier, SplitDetector, SplitSegmenter, SplitVQA

__all__ = [
    "POLICIES",
    "PadTo",
    "Placement",
    "Preprocessing",
    "SplitClassifier",
    "SplitDetector",
    "SplitModel",
    "SplitMultiTask",
    "SplitSegmenter",
    "SplitVQA",
    "load",
]
