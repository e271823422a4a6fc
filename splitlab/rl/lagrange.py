"""The adaptive multiplier that holds the mean token fraction at its target."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class FractionController(nn.Module):
    """Lagrange multiplier λ for the constraint "mean token fraction = target", PID-controlled.

    The plain dual update λ ← max(0, λ + η·(f̄ − target)) is the integral term. Alone it
    oscillates and lags: the policy answers a change of λ only after several PPO updates (an
    integrator acting on a lagging plant overshoots; a prototype swung 0.38 ↔ 0.66 and collapsed
    in 6 of 13 runs), and as PPO learns where tokens matter, the fraction a given λ buys keeps
    falling, so λ must track a moving target. Following the PID Lagrangian of Stooke et al.
    (2020), λ = max(0, I + k_p·e + k_d·Δe):

    - the proportional term reacts at once and vanishes at the target, so the integral only holds
      the steady-state price (the augmented-Lagrangian view of a quadratic penalty on the *mean*);
    - the derivative term damps: it pushes back while the fraction is already moving the right way;
    - the error ``e`` is measured on what evaluation deploys (the thresholded fraction, passed in
      by the caller) and smoothed with an EMA, so sampling and batch noise do not drive λ;
    - the integral is clamped to ``[0, lambda_max]`` (anti-windup).

    State lives in buffers, so it is in every checkpoint and on every device; with ``reduce`` set
    to a cross-rank mean, every rank computes the same λ.

    Args:
        target: target mean token fraction.
        lr: integral gain η (0 switches the integral off).
        gain: proportional gain k_p (0, with ``damping`` 0, gives the plain dual update).
        damping: derivative gain k_d.
        smoothing: EMA factor of the error (0 = no smoothing).
        lambda_init: starting λ.
        lambda_max: cap on the integral term.
        reduce: maps a local scalar tensor to its mean over ranks (identity on one process).
    """

    def __init__(
        self,
        target: float,
        lr: float = 0.1,
        gain: float = 0.5,
        damping: float = 0.0,
        smoothing: float = 0.5,
        lambda_init: float = 0.0,
        lambda_max: float = 10.0,
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.target = float(target)
        self.lr, self.gain, self.damping = float(lr), float(gain), float(damping)
        self.smoothing, self.lambda_max = float(smoothing), float(lambda_max)
        self.reduce = reduce
        self.register_buffer("integral", torch.tensor(float(lambda_init)))
        self.register_buffer("error", torch.tensor(0.0))
        self.register_buffer("change", torch.tensor(0.0))
        self.register_buffer("steps", torch.tensor(0, dtype=torch.long))

    @property
    def value(self) -> float:
        """Current λ (never below 0)."""
        return float((self.integral + self.gain * self.error + self.damping * self.change).clamp(min=0.0))

    @torch.no_grad()
    def update(self, fraction: Tensor | float) -> float:
        """One controller step from this step's mean fraction (local; reduced across ranks here)."""
        f = torch.as_tensor(fraction, dtype=torch.float32, device=self.integral.device).mean()
        if self.reduce is not None:
            f = self.reduce(f)
        error = f - self.target
        previous = self.error.clone()
        smoothed = (
            error if bool(self.steps == 0) else self.smoothing * self.error + (1 - self.smoothing) * error
        )
        self.change.copy_(smoothed - previous if bool(self.steps > 0) else torch.zeros_like(smoothed))
        self.error.copy_(smoothed)
        self.integral.copy_((self.integral + self.lr * error).clamp(0.0, self.lambda_max))
        self.steps += 1
        return self.value
