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

    Owns the stage plan and the length of PPO; uses of its task only what `SplitTask` defines
    (its parts, ``hparams``, ``controller``) and Lightning's API.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stage_plan: dict[str, int] | None = None
        self._ppo_total_steps = 1

    def task_modules(self) -> list[torch.nn.Module]:
        """What the task optimizer trains and frozen stages freeze: backbone, embeddings, head."""
        modules: list[torch.nn.Module] = [self.backbone, self.tokenizer.embed]
        if self.head is not None:
            modules.append(self.head)
        return modules

    def plan_stages(self, dense: int, warm_start: int, ppo: int) -> None:
        """Epochs of each stage in this fit, so learning-rate schedules span the right number of steps."""
        self.stage_plan = {"dense": int(dense), "warm_start": int(warm_start), "ppo": int(ppo)}

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        decay, no_decay = [], []
        timm_model = self.backbone.model  # timm's own list of parameters without weight decay, if any
        skip = {f"model.{n}" for n in getattr(timm_model, "no_weight_decay", lambda: set())()}
        for module in self.task_modules():
            for name, param in module.named_parameters():
                (no_decay if param.ndim <= 1 or name in skip or "level_embed" in name else decay).append(
                    param
                )
        task_opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": hp.optim.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=hp.optim.lr,
        )
        policy_opt = torch.optim.Adam(self.tokenizer.decision.parameters(), lr=hp.optim.policy_lr)
        total = max(self._stage_steps("supervised"), 1)
        self._ppo_total_steps = max(self._stage_steps("ppo"), 1)
        warmup = min(hp.optim.warmup_steps, total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        task_sched = torch.optim.lr_scheduler.LambdaLR(task_opt, schedule)
        return [task_opt, policy_opt], [task_sched]

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

    def set_policy_lr(self, stage: str) -> None:
        """The decision module's learning rate for ``stage``: ``imitation_lr`` outside PPO; in PPO
        ``policy_lr`` annealed (cosine to 5%) over the PPO batches.

        Late in PPO the policy should settle where λ holds it: a fast-moving policy at the end
        leaves the deployed fraction wherever the last oscillation put it. The PPO step count is
        the controller's (checkpointed) step counter, so the schedule survives resume.
        """
        if attached_trainer(self) is None or not self.trainer.optimizers:
            return
        if stage == "ppo":
            progress = min(self.controller.total_steps / self._ppo_total_steps, 1.0)
            lr = self.hparams.optim.policy_lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))
        else:
            lr = self.hparams.warm_start.imitation_lr
        for group in self.trainer.optimizers[1].param_groups:
            group["lr"] = lr

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
