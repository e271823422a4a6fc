"""SPLIT's training as plain PyTorch (no Lightning): `SplitTraining`, the one object Lightning, Fabric
and a plain loop drive (the stage, λ, the budgets, the warm start and PPO); the policy's steps (`imitation_loss`, PPO's
`roll_out` and `policy_loss`, which the Lightning task and a plain loop both run), and what each
split is worth to the task (`refinement_gains`), which the warm start's ``loss`` labels and the
``loss_oracle`` row read, and where training stands (`Progress`: the stage, the PPO updates run)."""

from splitlab.training.algorithm import ANCHORED_SOURCES, SplitTraining
from splitlab.training.gains import (
    autograd_ready,
    finest_outputs,
    gain_split_labels,
    on_finest_grid,
    patch_sums,
    per_image_shares,
    refinement_gains,
)
from splitlab.training.optimizers import Optimizers, build_optimizers, clip_by_norm, plain_backward
from splitlab.training.progress import STAGES, Progress, Stage
from splitlab.training.settings import (
    ControllerSettings,
    OptimSettings,
    TrainingSettings,
    WarmStartSettings,
)
from splitlab.training.steps import Rollouts, imitation_loss, policy_loss, roll_out
from splitlab.training.task import LossInputs, TaskFunctions

__all__ = [
    "ANCHORED_SOURCES",
    "ControllerSettings",
    "LossInputs",
    "OptimSettings",
    "Optimizers",
    "SplitTraining",
    "TaskFunctions",
    "TrainingSettings",
    "WarmStartSettings",
    "STAGES",
    "Progress",
    "Stage",
    "Rollouts",
    "autograd_ready",
    "build_optimizers",
    "clip_by_norm",
    "plain_backward",
    "imitation_loss",
    "on_finest_grid",
    "patch_sums",
    "per_image_shares",
    "policy_loss",
    "finest_outputs",
    "gain_split_labels",
    "refinement_gains",
    "roll_out",
]
