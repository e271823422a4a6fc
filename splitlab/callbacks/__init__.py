"""Lightning callbacks: the two-stage schedule, token-map pictures, layout predictions."""

from splitlab.callbacks.cluster import ResumePosition, SlurmRequeue
from splitlab.callbacks.pictures import TokenMapPictures, draw_token_map
from splitlab.callbacks.predictions import LayoutWriter
from splitlab.callbacks.schedule import SplitSchedule

__all__ = [
    "LayoutWriter",
    "ResumePosition",
    "SlurmRequeue",
    "SplitSchedule",
    "TokenMapPictures",
    "draw_token_map",
]
