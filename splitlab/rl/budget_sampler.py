"""Which budget a training batch of a budget-conditioned policy is drawn at."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class BudgetSampler(nn.Module):
    """Draws a budget point per batch, more often where the budget costs more task loss.

    Uniform draws spend as many steps on budgets that cost almost nothing (at a high budget the
    layout keeps nearly everything that matters) as on tight ones, and a budget-conditioned
    policy then trails a policy trained for a tight budget alone. Each point keeps a moving
    average of its task loss; its probability is that average's *excess over the lowest point's*,
    normalised, mixed with a uniform ``floor`` so every point keeps training. The excess, not the
    loss itself: every point's loss also holds what the frozen model gets wrong with any layout,
    which more policy steps cannot win back, so weights proportional to the whole loss barely
    favour the tight points (measured in docs/budgets.md). Draws are a function of
    a seed the caller passes (the same on every rank); the averages are reduced across ranks and
    live in buffers (checkpointed).

    Args:
        points: number of budget points.
        floor: share of the probability spread uniformly over the points.
        momentum: weight of a new batch in a point's loss average.
    """

    def __init__(self, points: int, floor: float = 0.1, momentum: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"budget sampling floor={floor} must lie in [0, 1]")
        self.floor, self.momentum = float(floor), float(momentum)
        self.register_buffer("loss", torch.zeros(points))
        self.register_buffer("seen", torch.zeros(points, dtype=torch.long))

    def probabilities(self) -> Tensor:
        """``(K,)`` draw probabilities (uniform until every point has been seen once, and while
        every point's loss is the same)."""
        k = self.loss.numel()
        uniform = torch.full((k,), 1.0 / k)
        if bool((self.seen == 0).any()):
            return uniform
        loss = self.loss.detach().cpu()
        excess = loss - loss.min()
        if float(excess.sum()) <= 0:
            return uniform
        return self.floor * uniform + (1 - self.floor) * excess / excess.sum()

    def draw(self, seed: int) -> int:
        """A budget point drawn with `probabilities`, from a generator seeded with ``seed``."""
        generator = torch.Generator().manual_seed(int(seed))
        return int(torch.multinomial(self.probabilities(), 1, generator=generator))

    @torch.no_grad()
    def update(
        self, point: int, loss: Tensor | float, reduce: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        """Fold a batch's mean task loss into point ``point``'s average (mean over ranks under DDP)."""
        value = torch.as_tensor(loss, dtype=torch.float32, device=self.loss.device).mean()
        if reduce is not None:
            value = reduce(value)
        weight = 1.0 if int(self.seen[point]) == 0 else self.momentum
        self.loss[point] += weight * (value - self.loss[point])
        self.seen[point] += 1
