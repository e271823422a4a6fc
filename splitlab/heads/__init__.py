"""Task heads on `PackedViT` features (plain PyTorch, usable from any training loop).

The feature pyramid that dense heads share, torchvision's detection heads, the mmsegmentation
decode-head adapter. The LightningModules in `splitlab.tasks` wire a head to its loss and metrics.
"""

from splitlab.heads.detection import (
    DETECTORS,
    DetectionHead,
    DetectorSettings,
    reference_proposals,
    without_crowd,
)
from splitlab.heads.pyramid import (
    PYRAMID_CHANNELS,
    SimpleFeaturePyramid,
    check_pyramid_grid,
    default_pyramid_indices,
    pyramid_grids,
    pyramid_scales,
)
from splitlab.heads.segmentation import SegmentationHead, pixel_cross_entropy
from splitlab.heads.vqa import LanguageBridge, VisualProjector, VQAHead, token_order

__all__ = [
    "PYRAMID_CHANNELS",
    "DETECTORS",
    "DetectionHead",
    "DetectorSettings",
    "LanguageBridge",
    "SegmentationHead",
    "SimpleFeaturePyramid",
    "VQAHead",
    "VisualProjector",
    "check_pyramid_grid",
    "default_pyramid_indices",
    "pixel_cross_entropy",
    "pyramid_grids",
    "pyramid_scales",
    "reference_proposals",
    "token_order",
    "without_crowd",
]
