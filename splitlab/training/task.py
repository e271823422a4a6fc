"""What the training object reads of a task: `TaskFunctions`, the few calls of a task's own code
that a training step makes, and `LossInputs`, what a per-image loss may read of the run.

A task's `splitlab.tasks.TaskLogic` is one (so is the multi-task model's), and so is the dozen
lines a plain loop writes for its own task (examples/plain_pytorch.py): the training object never
sees a LightningModule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from splitlab.tokenizer import TokenLayout


@dataclass(frozen=True)
class LossInputs:
    """What a per-image loss may read of the run: the policy's sampling generator (detection seeds
    its heads' samplers from it, so that resumed runs repeat them) and whether the RoI loss is taken
    on PPO's layout-independent reference proposals."""

    generator: torch.Generator
    reference: bool = False


class TaskFunctions(Protocol):
    """A task's own code as a training step calls it (`splitlab.training.SplitTraining`)."""

    def unpack_batch(self, batch: Any) -> tuple[Tensor, Any]:
        """``(images, targets)`` of a batch."""
        ...

    def repeat_targets(self, targets: Any, times: int) -> Any:
        """Targets for ``times`` rollouts of the batch, rollout after rollout."""
        ...

    def forward_layout(self, layout: TokenLayout) -> Any:
        """The task's outputs on a layout."""
        ...

    def per_image_loss(self, outputs: Any, targets: Any, inputs: LossInputs) -> Tensor:
        """Each image's task loss, ``(B,)``: its mean trains the task, its values are PPO's rewards."""
        ...

    def own_targets(self, reference: Any, targets: Any) -> Any:
        """The model's own prediction from its outputs on the finest grid, as targets (``fidelity``)."""
        ...

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor | None:
        """``(B, rows, cols)`` bool: the finest cells the batch's annotations mark, or None."""
        ...
