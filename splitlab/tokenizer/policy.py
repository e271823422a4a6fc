"""The split policy's distribution: one independent Bernoulli per candidate patch.

The one place that samples decisions from split logits and scores them (log-probability,
entropy): the tokenizer's ``sample`` mode, the warm start, PPO's rollouts and its surrogate all
call these, so the policy they train is the policy that is deployed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def sample(logits: Sequence[Tensor], generator: torch.Generator | None = None) -> list[Tensor]:
    """Bool split decisions drawn from ``sigmoid(logits)``, level by level, from ``generator``."""
    with torch.no_grad():
        return [torch.bernoulli(torch.sigmoid(lg.float()), generator=generator).bool() for lg in logits]


def log_prob(logits: Tensor, decisions: Tensor) -> Tensor:
    """Elementwise log-probability of bool ``decisions`` under ``sigmoid(logits)``."""
    logits = logits.float()
    return torch.where(decisions, F.logsigmoid(logits), F.logsigmoid(-logits))


def entropy(logits: Tensor) -> Tensor:
    """Elementwise entropy (nats) of ``Bernoulli(sigmoid(logits))``."""
    logits = logits.float()
    return F.binary_cross_entropy_with_logits(logits, torch.sigmoid(logits), reduction="none")
