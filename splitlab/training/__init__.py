"""SPLIT's training as plain PyTorch (no Lightning): the policy's steps (`imitation_loss`, PPO's
`roll_out` and `policy_loss`, which the Lightning task and a plain loop both run), and what each
split is worth to the task (`refinement_gains`), which the warm start's ``loss`` labels and the
``loss_oracle`` row read, and where training stands (`Progress`: the stage, the PPO updates run)."""

from splitlab.training.gains import (
    autograd_ready,
    finest_outputs,
    on_finest_grid,
    patch_sums,
    per_image_shares,
    refinement_gains,
)
from splitlab.training.progress import STAGES, Progress, Stage
from splitlab.training.steps import Rollouts, imitation_loss, policy_loss, roll_out

__all__ = [
    "STAGES",
    "Progress",
    "Stage",
    "Rollouts",
    "autograd_ready",
    "imitation_loss",
    "on_finest_grid",
    "patch_sums",
    "per_image_shares",
    "policy_loss",
    "finest_outputs",
    "refinement_gains",
    "roll_out",
]
