"""Lightning callbacks: the two-stage schedule, token-map pictures, layout predictions, and the ones
that keep work from being lost (graceful stop, SLURM requeue, mid-epoch resume, verified checkpoints)."""

from splitlab.callbacks.cluster import ResumePosition, SlurmRequeue
from splitlab.callbacks.pictures import TokenMapPictures, draw_token_map
from splitlab.callbacks.predictions import LayoutWriter
from splitlab.callbacks.run import (
    RUN_CALLBACKS,
    SafeCheckpoints,
    install_safe_checkpoints,
    missing_run_callbacks,
)
from splitlab.callbacks.safety import AgreedCheckpointSave, GracefulStop, SkippedSamples, VerifiedCheckpointIO
from splitlab.callbacks.schedule import SplitSchedule

__all__ = [
    "RUN_CALLBACKS",
    "AgreedCheckpointSave",
    "GracefulStop",
    "LayoutWriter",
    "ResumePosition",
    "SafeCheckpoints",
    "SkippedSamples",
    "SlurmRequeue",
    "SplitSchedule",
    "TokenMapPictures",
    "VerifiedCheckpointIO",
    "draw_token_map",
    "install_safe_checkpoints",
    "missing_run_callbacks",
]
