"""The optimizers SPLIT trains with and what a training loop gives each step (`Optimizers`): its
optimizers, how it runs a backward and clips (Lightning's distributed ones, Fabric's, or plain)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from splitlab.model import SplitModel
from splitlab.training.settings import OptimSettings


def plain_backward(loss: Tensor, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """A plain loop's backward: every rank (there is one) has its gradients."""
    loss.backward()


def clip_by_norm(optimizer: torch.optim.Optimizer, max_norm: float) -> None:
    """Clip an optimizer's gradients to a total norm of ``max_norm``, as Lightning clips by norm."""
    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], max_norm)


@dataclass
class Optimizers:
    """What the loop gives each step: its two optimizers, how it runs a backward and clips.

    Attributes:
        task: backbone, head and embeddings (dense and warm start; `SplitTraining.optimizers`).
        policy: the decision module (warm start's imitation, PPO).
        task_schedule: the task's learning-rate schedule, stepped with it (None: constant).
        ppo_steps: PPO batches planned: the policy's learning rate anneals over them.
        steps: optimizer steps taken so far; the budget of a batch is drawn from it, and the steps
            count themselves on it (a Lightning task sets it from ``global_step`` each batch, which
            counts the same steps and survives a resume).
        backward: ``backward(loss, optimizers)``: the loop's backward, and the gradients of those
            optimizers made the same on every rank (Lightning's, Fabric's, or plain).
        clip: ``clip(optimizer, max_norm)``: the loop's clipping of an optimizer's gradients.
    """

    task: torch.optim.Optimizer
    policy: torch.optim.Optimizer
    task_schedule: Any = None
    ppo_steps: int = 1
    steps: int = 0
    backward: Callable[[Tensor, Sequence[torch.optim.Optimizer]], None] = plain_backward
    clip: Callable[[torch.optim.Optimizer, float], None] = clip_by_norm


def build_optimizers(
    model: SplitModel,
    task_modules: Sequence[nn.Module],
    optim: OptimSettings,
    supervised_steps: int,
    ppo_steps: int = 1,
) -> Optimizers:
    """The two optimizers and the task's schedule (linear warm-up, then cosine to 0 over the
    ``supervised_steps`` of the dense and warm-start stages); no weight decay on biases, norms,
    timm's own list (tokens, position embeddings) and the level embeddings."""
    timm_model = model.backbone.model
    skip = {f"model.{n}" for n in getattr(timm_model, "no_weight_decay", lambda: set())()}
    decay, no_decay = [], []
    for module in task_modules:
        for name, param in module.named_parameters():
            plain = param.ndim <= 1 or name in skip or "level_embed" in name
            (no_decay if plain else decay).append(param)
    task_opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": optim.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=optim.lr,
    )
    policy_opt = torch.optim.Adam(model.tokenizer.decision.parameters(), lr=optim.policy_lr)
    total = max(int(supervised_steps), 1)
    warmup = min(optim.warmup_steps, total)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    task_sched = torch.optim.lr_scheduler.LambdaLR(task_opt, schedule)
    return Optimizers(task_opt, policy_opt, task_sched, max(int(ppo_steps), 1))
