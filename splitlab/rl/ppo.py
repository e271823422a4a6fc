"""PPO for the split policy: advantages and the clipped surrogate over per-patch decisions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PPOConfig:
    """PPO settings (defaults from what kept the prototype stable; see the base task).

    Attributes:
        samples: rollouts per image; their mean reward is each image's baseline.
        epochs: optimisation epochs over each rollout.
        clip: surrogate clip range.
        entropy_coef: weight of the mean decision entropy bonus.
        max_grad_norm: gradient clipping of the policy update.
        normalize: ``rollout``: each rollout's surrogate is the mean over its own decisions, then
            rollouts are averaged (every image weighs the same); ``decision``: the sum over all
            decisions of the batch divided by their number (every decision weighs the same). See
            `ppo_policy_loss` for the difference, measured in docs/comparison.md.
        target_kl: stop a batch's policy epochs early once the approximate KL to the rollout policy
            passes 1.5x this (None: always run ``epochs``).
        imitation: weight of the warm start's imitation loss kept in each policy update (0: PPO
            alone). Where the labels are the oracle's (annotations), an anchor the noisy reward
            cannot walk the policy away from; where they are estimated (embedding differences), a
            pull toward labels the reward already beats (docs/oracle.md). None (the default): 1.0
            with labels that read the task (annotations, loss, fidelity), 0 with proxies (embedding
            differences, entropy) (the task resolves it).
    """

    samples: int = 4
    epochs: int = 4
    clip: float = 0.2
    entropy_coef: float = 0.01
    max_grad_norm: float = 1.0
    normalize: str = "decision"
    target_kl: float | None = None
    imitation: float | None = None

    def __post_init__(self) -> None:
        if self.normalize not in ("rollout", "decision"):
            raise ValueError(f"ppo.normalize={self.normalize!r}: expected 'rollout' or 'decision'")
        if self.imitation is not None and self.imitation < 0:
            raise ValueError(f"ppo.imitation={self.imitation}: a weight, at least 0")
        if self.samples < 1 or self.epochs < 1:
            raise ValueError(f"ppo.samples={self.samples}, ppo.epochs={self.epochs}: both must be at least 1")
        for name, low in (("clip", 0.0), ("max_grad_norm", 0.0), ("entropy_coef", None), ("target_kl", 0.0)):
            value = getattr(self, name)
            if value is None and name == "target_kl":
                continue
            if not (math.isfinite(value) and (value > low if low is not None else value >= 0)):
                bound = "above 0" if low is not None else "at least 0"
                raise ValueError(f"model.init_args.ppo.{name}={value!r}: must be a finite number {bound}")


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


def ppo_policy_loss(
    new_log_prob: Sequence[Tensor],
    old_log_prob: Sequence[Tensor],
    entropy: Sequence[Tensor],
    candidates: Sequence[Tensor],
    advantage: Tensor,
    clip: float = 0.2,
    entropy_coef: float = 0.01,
    normalize: str = "decision",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO surrogate with one ratio per decision of a factored policy.

    Each decision of a rollout is an action that shares its rollout's advantage. Ratios per
    decision, rather than one ratio of the product over an image's 10-100 decisions, keep the
    ratio near 1 and the clipping meaningful. With ``normalize="rollout"`` the surrogate and entropy
    are averaged per rollout over its decisions, then over rollouts: every image weighs the same,
    so a decision of an image with few candidates weighs more than one of an image with many
    (that is a reweighting of the policy gradient, not the gradient of the expected reward).
    ``normalize="decision"`` sums over all decisions and divides by their total: the unbiased
    per-decision average.
    The distribution itself stays with the caller (SPLIT's is a Bernoulli per patch,
    `splitlab.tokenizer.policy`): PPO only needs log-probabilities and entropies.

    Args:
        new_log_prob: per level ``(N, h, w)`` log-probability of the decisions taken, under the
            current policy (differentiable).
        old_log_prob: the same under the rollout policy.
        entropy: per level ``(N, h, w)`` entropy of the current policy (differentiable).
        candidates: per level ``(N, h, w)`` bool: where a decision was taken.
        advantage: ``(N,)`` advantage of each rollout.

    Returns:
        the loss to minimise and detached statistics (surrogate, entropy, clip fraction, approx KL).
    """
    surrogate = torch.zeros_like(advantage)
    total_entropy = torch.zeros_like(advantage)
    clipped = torch.zeros_like(advantage)
    kl = torch.zeros_like(advantage)
    count = torch.zeros_like(advantage)
    adv = advantage.view(-1, 1, 1)
    for new, old, ent, cand in zip(new_log_prob, old_log_prob, entropy, candidates, strict=True):
        mask = cand.to(new.dtype)
        log_ratio = new - old.detach()
        ratio = log_ratio.exp()
        unclipped = ratio * adv
        bounded = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
        surrogate = surrogate + (torch.minimum(unclipped, bounded) * mask).flatten(1).sum(1)
        total_entropy = total_entropy + (ent * mask).flatten(1).sum(1)
        clipped = clipped + (((ratio - 1.0).abs() > clip).to(mask.dtype) * mask).flatten(1).sum(1).detach()
        kl = kl + (((ratio - 1.0) - log_ratio) * mask).flatten(1).sum(1).detach()
        count = count + mask.flatten(1).sum(1)
    count = count.clamp(min=1.0)
    if normalize == "decision":
        total = count.sum()
        loss = -surrogate.sum() / total - entropy_coef * total_entropy.sum() / total
    else:
        loss = -(surrogate / count).mean() - entropy_coef * (total_entropy / count).mean()
    surrogate, mean_entropy = surrogate / count, total_entropy / count
    stats = {
        "surrogate": surrogate.mean().detach(),
        "entropy": mean_entropy.mean().detach(),
        "clip_fraction": (clipped / count).mean(),
        "approx_kl": (kl / count).mean(),
    }
    return loss, stats
