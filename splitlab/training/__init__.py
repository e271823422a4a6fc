"""SPLIT's training as plain PyTorch (no Lightning): what each split is worth to the task
(`refinement_gains`), which the warm start's ``loss`` labels and the ``loss_oracle`` row read."""

from splitlab.training.gains import (
    autograd_ready,
    on_finest_grid,
    patch_sums,
    per_image_shares,
    refinement_gains,
)

__all__ = ["autograd_ready", "on_finest_grid", "patch_sums", "per_image_shares", "refinement_gains"]
