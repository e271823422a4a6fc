"""How a `SplitTask` optimises: its two optimizers and their schedules over the planned stages, and
the gradient sync under DDP and FSDP that manual optimisation does itself."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributed.fsdp import FullyShardedDataParallel

from splitlab.distributed import average_gradients, block_parameter_ids, clip_grad_norm, sharded_backward
from splitlab.lightning_private import attached_trainer


class Optimization:
    """The task's two optimizers (task and policy) and their learning rates, with manual optimisation
    exactly as Lightning's docs describe it: ``self.optimizers()``, ``manual_backward``, schedulers
    stepped by hand.

    Owns the stage plan and the length of PPO; the optimizers themselves are the training object's
    (`SplitTraining.optimizers`); uses of its task only what `SplitTask` defines and Lightning's API.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stage_plan: dict[str, int] | None = None
        self.ppo_total_steps = 1  # PPO batches planned in this fit (`configure_optimizers`)

    def plan_stages(self, dense: int, warm_start: int, ppo: int) -> None:
        """Epochs of each stage in this fit, so learning-rate schedules span the right number of steps."""
        self.stage_plan = {"dense": int(dense), "warm_start": int(warm_start), "ppo": int(ppo)}

    def configure_optimizers(self) -> Any:
        """The training object's two optimizers and the task's schedule, over this fit's stage plan."""
        optimizers = self.algorithm.optimizers(self._stage_steps("supervised"), self._stage_steps("ppo"))
        self.ppo_total_steps = optimizers.ppo_steps  # the policy's learning rate anneals over them
        return [optimizers.task, optimizers.policy], [optimizers.task_schedule]

    def _stage_steps(self, which: str) -> int:
        """Batches the supervised stages (dense + warm start) or PPO will see in this fit.

        The epoch counts come from `plan_stages` (the schedule callback calls it); without a plan,
        every batch of the fit counts for both.
        """
        trainer = self.trainer
        plan = self.stage_plan
        if plan is None or not trainer.max_epochs or trainer.max_epochs < 1:
            return int(trainer.estimated_stepping_batches)
        per_epoch = math.ceil(trainer.estimated_stepping_batches / trainer.max_epochs)
        supervised = plan["dense"] + plan["warm_start"]
        return per_epoch * (supervised if which == "supervised" else trainer.max_epochs - supervised)

    def backward_synced(self, loss: Tensor, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """``manual_backward``, then one coalesced all-reduce (mean) of the optimizers' gradients under
        DDP (under FSDP, of those outside the sharded blocks: FSDP reduce-scatters the blocks' own).

        DDP's reducer needs every trainable parameter to receive a gradient in every backward
        (or ``find_unused_parameters``, a graph walk per step). Here the used set depends on the
        data (a level with no kept token on one rank gives its embedding no gradient) and on the
        stage (PPO's K backward passes touch only the decision module), so the backward runs
        without DDP's sync and the gradients are averaged here: missing ones count as zero, so
        every rank applies the same update. In PPO only the small policy is communicated.
        """
        model = self.trainer.model if attached_trainer(self) is not None else None
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            with model.no_sync():
                self.manual_backward(loss)
            sharded: set[int] = set()
        elif isinstance(model, FullyShardedDataParallel):
            sharded_backward(model, lambda: self.manual_backward(loss))
            sharded = block_parameter_ids(self)
        else:
            self.manual_backward(loss)
            return
        average_gradients(
            p
            for opt in optimizers
            for group in opt.param_groups
            for p in group["params"]
            if p.requires_grad and id(p) not in sharded
        )

    def clip_norm(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        """Clip an optimizer's gradients to ``max_norm`` (Lightning's clipping, or, under FSDP where
        Lightning cannot clip by norm, one that counts the sharded blocks' gradients over ranks)."""
        model = self.trainer.model if attached_trainer(self) is not None else None
        if not isinstance(model, FullyShardedDataParallel):
            self.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]

        def over_shards(t: Tensor) -> Tensor:  # the ranks that split one copy (one node under HYBRID_SHARD)
            torch.distributed.all_reduce(t, group=model.process_group)
            return t

        clip_grad_norm(params, max_norm, block_parameter_ids(self), over_shards)
