"""The adaptive multiplier that holds the mean token fraction at its target."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


class FractionController(nn.Module):
    """Lagrange multiplier λ for the constraint "mean token fraction = target", PID-controlled.

    The plain dual update λ ← max(0, λ + η·(f̄ − target)) is the integral term. Alone it
    oscillates and lags: the policy answers a change of λ only after several PPO updates (an
    integrator acting on a lagging plant overshoots), and as PPO learns where tokens matter, the fraction a given λ buys keeps
    falling, so λ must track a moving target. Following the PID Lagrangian of Stooke et al.
    (2020), λ = max(0, I + k_p·e + k_d·Δe):

    - the proportional term reacts at once and vanishes at the target, so the integral only holds
      the steady-state price (the augmented-Lagrangian view of a quadratic penalty on the *mean*);
    - the derivative term damps: it pushes back while the fraction is already moving the right way;
    - the error ``e`` is measured on the fraction the reward penalises (the caller passes the
      sampled rollouts' mean), so λ is the price at which the stochastic policy's expected usage
      meets the budget, and smoothed with an EMA against batch noise;
    - the integral is clamped to ``[0, lambda_max]`` (anti-windup).

    With several budgets (a budget-conditioned policy) the controller keeps one multiplier per
    budget point, each updated only by the batches trained at its budget; λ between points is
    interpolated (`value_at`).

    State lives in buffers, so it is in every checkpoint and on every device; with ``reduce`` set
    to a cross-rank mean, every rank computes the same λ.

    Args:
        budget: the target mean token fraction, or one per budget point (ascending).
        lr: integral gain η (0 switches the integral off).
        gain: proportional gain k_p (0, with ``damping`` 0, gives the plain dual update).
        damping: derivative gain k_d.
        smoothing: EMA factor of the error (0 = no smoothing).
        init: starting λ (``controller.init`` of a task's settings: one name for it).
        lambda_max: cap on the integral term.
        reduce: maps a local scalar tensor to its mean over ranks (identity on one process).
    """

    def __init__(
        self,
        budget: float | Sequence[float],
        lr: float = 0.1,
        gain: float = 0.5,
        damping: float = 0.0,
        smoothing: float = 0.5,
        init: float = 0.0,
        lambda_max: float = 10.0,
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__()
        budgets = [float(b) for b in (budget if isinstance(budget, Sequence) else [budget])]
        self.budgets = budgets
        self.lr, self.gain, self.damping = float(lr), float(gain), float(damping)
        self.smoothing, self.lambda_max = float(smoothing), float(lambda_max)
        self.reduce = reduce
        k = len(budgets)
        self.register_buffer("integral", torch.full((k,), float(init)))
        self.register_buffer("error", torch.zeros(k))
        self.register_buffer("change", torch.zeros(k))
        self.register_buffer("steps", torch.zeros(k, dtype=torch.long))

    @property
    def budget(self) -> float:
        """The (first) budget."""
        return self.budgets[0]

    @property
    def values(self) -> Tensor:
        """``(K,)`` λ of every budget point (never below 0)."""
        return (self.integral + self.gain * self.error + self.damping * self.change).clamp(min=0.0)

    @property
    def value(self) -> float:
        """Current λ of the first (or only) budget point."""
        return float(self.values[0])

    def value_at(self, budget: float) -> float:
        """λ at ``budget``, interpolated between the budget points."""
        values = self.values.tolist()
        if len(values) == 1:
            return values[0]
        points = self.budgets
        budget = min(max(float(budget), points[0]), points[-1])
        i = min(max(bisect.bisect_right(points, budget) - 1, 0), len(points) - 2)
        w = (budget - points[i]) / (points[i + 1] - points[i])
        return values[i] + w * (values[i + 1] - values[i])

    @property
    def total_steps(self) -> int:
        """Controller steps over all budget points (PPO steps taken)."""
        return int(self.steps.sum())

    @torch.no_grad()
    def update(self, fraction: Tensor | float, point: int = 0) -> float:
        """One controller step of budget point ``point`` from this step's mean fraction (local;
        reduced across ranks here). Returns that point's λ."""
        f = torch.as_tensor(fraction, dtype=torch.float32, device=self.integral.device).mean()
        if self.reduce is not None:
            f = self.reduce(f)
        error = f - self.budgets[point]
        first = bool(self.steps[point] == 0)
        previous = self.error[point].clone()
        smoothed = error if first else self.smoothing * self.error[point] + (1 - self.smoothing) * error
        self.change[point] = torch.zeros_like(smoothed) if first else smoothed - previous
        self.error[point] = smoothed
        self.integral[point] = (self.integral[point] + self.lr * error).clamp(0.0, self.lambda_max)
        self.steps[point] += 1
        return float(self.values[point])
