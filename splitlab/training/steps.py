"""SPLIT's policy steps as plain functions of a `SplitModel`: the warm start's imitation loss, PPO's
rollouts and PPO's policy loss. `SplitTask` (Lightning, with its distributed backward and clipping)
and examples/plain_pytorch.py (a plain loop) both run these, so a fix reaches both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from splitlab.model import SplitModel
from splitlab.rl import PPOConfig, advantages, ppo_policy_loss
from splitlab.tokenizer import TokenLayout, policy


def imitation_loss(logits: Sequence[Tensor], labels: Sequence[Tensor]) -> Tensor:
    """The warm start's BCE of the split logits against the labels, over every patch of every level."""
    total = sum(
        F.binary_cross_entropy_with_logits(lg.float(), lab.float(), reduction="sum")
        for lg, lab in zip(logits, labels, strict=True)
    )
    return total / sum(lab.numel() for lab in labels)


@dataclass
class Rollouts:
    """One PPO batch: ``samples`` sampled layouts per image (rollout after rollout), scored.

    Attributes:
        tokens: the batch's multi-scale embeddings (the policy reads them again in each epoch).
        layouts: the sampled layouts of all rollouts, with their decisions and candidates.
        task_loss: each rollout's task loss, ``(samples * B,)``.
        reward: ``-task_loss - λ * token fraction``.
        advantage: the reward against the mean of the same image's rollouts.
        old_log_prob: each level's log-probability of the sampled decisions under the sampling policy.
        samples: rollouts per image.
    """

    tokens: list[Tensor]
    layouts: TokenLayout
    task_loss: Tensor
    reward: Tensor
    advantage: Tensor
    old_log_prob: list[Tensor]
    samples: int


@torch.no_grad()
def roll_out(
    model: SplitModel,
    images: Tensor,
    budget: float,
    lam: float,
    samples: int,
    score: Callable[[TokenLayout], Tensor],
    generator: torch.Generator | None = None,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Rollouts:
    """Sample ``samples`` layouts per image from the policy at ``budget`` and score them with the frozen
    model: ``score(layouts)`` is each rollout's task loss (the model's outputs on them, the loss of the
    repeated targets); ``reduce`` averages the advantages' baseline over ranks."""
    tokens, _ = model.tokenizer.embed(images, model.backbone)
    old_logits = model.tokenizer.decision_logits(tokens, budget)
    layouts = model.tokenizer.tokenize(
        [t.repeat(samples, 1, 1, 1) for t in tokens],
        "sample",
        logits=[lg.repeat(samples, 1, 1) for lg in old_logits],
        generator=generator,
    )
    task_loss = score(layouts).float()
    reward = -task_loss - lam * layouts.fraction
    advantage = advantages(reward.view(samples, -1), reduce_mean=reduce).reshape(-1)
    old_log_prob = [policy.log_prob(lg, d) for lg, d in zip(layouts.logits, layouts.decisions, strict=True)]
    return Rollouts(list(tokens), layouts, task_loss, reward, advantage, old_log_prob, samples)


def policy_loss(
    model: SplitModel, rolled: Rollouts, budget: float, cfg: PPOConfig
) -> tuple[Tensor, dict[str, Tensor], list[Tensor]]:
    """PPO's clipped surrogate (with its entropy bonus) of the policy as it is now on ``rolled``; its
    statistics, and the batch's logits (one per image, for an anchor to the warm start's labels)."""
    logits = model.tokenizer.decision_logits(rolled.tokens, budget)
    repeated = [lg.repeat(rolled.samples, 1, 1) for lg in logits]
    layouts = rolled.layouts
    loss, stats = ppo_policy_loss(
        [policy.log_prob(lg, d) for lg, d in zip(repeated, layouts.decisions, strict=True)],
        rolled.old_log_prob,
        [policy.entropy(lg) for lg in repeated],
        layouts.candidates,
        rolled.advantage,
        cfg.clip,
        cfg.entropy_coef,
        cfg.normalize,
    )
    return loss, stats, logits
