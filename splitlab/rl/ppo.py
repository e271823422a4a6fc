"""PPO for the split policy: advantages and the clipped surrogate over per-patch decisions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class PPOConfig:
    """PPO settings (defaults from what kept the prototype stable; see the base task).

    Attributes:
        samples: rollouts per image; their mean reward is each image's baseline.
        epochs: optimisation epochs over each rollout.
        clip: surrogate clip range.
        entropy_coef: weight of the mean decision entropy bonus.
        max_grad_norm: gradient clipping of the policy update.
    """

    samples: int = 4
    epochs: int = 4
    clip: float = 0.2
    entropy_coef: float = 0.01
    max_grad_norm: float = 1.0


def advantages(
    rewards: Tensor, eps: float = 1e-8, reduce_mean: Callable[[Tensor], Tensor] | None = None
) -> Tensor:
    """Baseline-subtracted, batch-normalised advantages.

    Args:
        rewards: ``(S, B)``: ``S`` rollouts of ``B`` images. With ``S > 1`` each image's mean
            reward is its baseline (image difficulty cancels); with ``S == 1`` the batch mean is.
        reduce_mean: averages a scalar over DDP ranks, so that every rank normalises by the
            global batch's spread (and the batch-mean baseline is global too).

    Returns:
        ``(S, B)`` advantages with unit standard deviation over the batch (all zero when every
        reward is equal).
    """
    rewards = rewards.float()
    reduce = reduce_mean or (lambda t: t)
    baseline = rewards.mean(0, keepdim=True) if rewards.shape[0] > 1 else reduce(rewards.mean())
    centred = rewards - baseline
    std = reduce(centred.pow(2).mean()).sqrt()
    return centred / (std + eps)


def bernoulli_log_prob(logits: Tensor, decisions: Tensor) -> Tensor:
    """Elementwise log-probability of bool ``decisions`` under ``sigmoid(logits)``."""
    return torch.where(decisions, F.logsigmoid(logits), F.logsigmoid(-logits))


def bernoulli_entropy(logits: Tensor) -> Tensor:
    """Elementwise entropy (nats) of ``Bernoulli(sigmoid(logits))``."""
    return F.binary_cross_entropy_with_logits(logits, torch.sigmoid(logits), reduction="none")


def ppo_policy_loss(
    new_logits: Sequence[Tensor],
    old_logits: Sequence[Tensor],
    decisions: Sequence[Tensor],
    candidates: Sequence[Tensor],
    advantage: Tensor,
    clip: float = 0.2,
    entropy_coef: float = 0.01,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO surrogate with one ratio per split decision.

    Each decision of a rollout is an action that shares its rollout's advantage. Ratios per
    decision, rather than one ratio of the product over an image's 10-100 decisions, keep the
    ratio near 1 and the clipping meaningful. Per rollout the surrogate and entropy are averaged
    over its decisions (so images with many candidates do not dominate), then over rollouts.

    Args:
        new_logits, old_logits: per non-finest level ``(N, h, w)`` logits under the current and the
            rollout policy.
        decisions, candidates: per level ``(N, h, w)`` bool decisions taken and where they were taken.
        advantage: ``(N,)`` advantage of each rollout.

    Returns:
        the loss to minimise and detached statistics (surrogate, entropy, clip fraction, approx KL).
    """
    surrogate = torch.zeros_like(advantage)
    entropy = torch.zeros_like(advantage)
    clipped = torch.zeros_like(advantage)
    kl = torch.zeros_like(advantage)
    count = torch.zeros_like(advantage)
    adv = advantage.view(-1, 1, 1)
    for new, old, taken, cand in zip(new_logits, old_logits, decisions, candidates, strict=True):
        mask = cand.to(new.dtype)
        log_ratio = bernoulli_log_prob(new.float(), taken) - bernoulli_log_prob(old.float().detach(), taken)
        ratio = log_ratio.exp()
        unclipped = ratio * adv
        bounded = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
        surrogate = surrogate + (torch.minimum(unclipped, bounded) * mask).flatten(1).sum(1)
        entropy = entropy + (bernoulli_entropy(new.float()) * mask).flatten(1).sum(1)
        clipped = clipped + (((ratio - 1.0).abs() > clip).to(mask.dtype) * mask).flatten(1).sum(1).detach()
        kl = kl + (((ratio - 1.0) - log_ratio) * mask).flatten(1).sum(1).detach()
        count = count + mask.flatten(1).sum(1)
    count = count.clamp(min=1.0)
    surrogate, entropy = surrogate / count, entropy / count
    loss = -surrogate.mean() - entropy_coef * entropy.mean()
    stats = {
        "surrogate": surrogate.mean().detach(),
        "entropy": entropy.mean().detach(),
        "clip_fraction": (clipped / count).mean(),
        "approx_kl": (kl / count).mean(),
    }
    return loss, stats
