"""`DenseTask`: what the dense tasks (detection, segmentation) share: a feature pyramid from chosen blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from splitlab.model.head_settings import PyramidHeadSettings
from splitlab.tasks.base import SplitTask


class DenseTask(SplitTask):
    """A `SplitTask` whose head reads a ViTDet-style simple feature pyramid.

    The chosen blocks' packed tokens are spread over the finest grid and rescaled to strides
    4-32 px (`splitlab.heads.SimpleFeaturePyramid`); subclasses put their head on top.

    Args:
        pyramid_channels: channels of the feature pyramid.
        pyramid_indices: blocks feeding the pyramid levels (1 or 4; default: 4 evenly spaced).
        **kwargs: `SplitTask` arguments.
    """

    def __init__(
        self,
        pyramid_channels: int = PyramidHeadSettings.pyramid_channels,
        pyramid_indices: Sequence[int] | None = PyramidHeadSettings.pyramid_indices,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
