"""Token budgets: the budget points a policy is trained for, and where it cuts to meet each one.

A stochastic policy trained so that its *sampled* layouts meet a mean budget does not meet it
when thresholded at p = 0.5: where p hovers near 0.5, thresholding turns a coin flip into a
certain split (or a certain keep), and the deployed fraction drifts by 0.1 and more (measured on
the COCO twin: 0.63 for a target of 0.50). `OperatingPoints` therefore keeps, per budget point, the
logit cut at which the deterministic policy meets that budget on the training distribution. It
is calibrated like BatchNorm's running statistics: a moving average of each training batch's
exact cut, reduced across ranks, checkpointed with the model. Between points the cut is
interpolated, as the decision module's budget input is.

A hard per-image cap (``max_fraction``) removes tokens after the cut, so a cut met without the cap
falls short under it (measured on the demo run: 0.443 for a budget of 0.50 capped at 0.50). The
calibration sample therefore also leaves its *spread*: per point, the per-image fractions at a
grid of cuts, kept as quantiles. Any cap given later, at evaluation or deployment, turns that into
the cut whose capped layouts meet the budget (`capped_cuts`), with no data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from splitlab.tokenizer.baselines import calibrate_threshold
from splitlab.tokenizer.quadtree import fractions_at

SPREAD_CUTS = 64  # cuts per point at which the calibration sample's fractions are kept
SPREAD_QUANTILES = 64  # quantiles of the per-image fraction kept at each cut (midpoints)
BETWEEN = 3  # budgets calibrated between two neighbouring points (at 1/4, 1/2, 3/4 of the way)


def budget_points(budget_range: Sequence[float]) -> list[float]:
    """The training budget points of a range ``[lo, hi]`` or ``[lo, hi, step]`` (step 0.1 unless
    given): ``lo, lo + step, ..., hi`` (``hi`` always included)."""
    if len(budget_range) not in (2, 3):
        raise ValueError(
            f"budget_range={list(budget_range)}: give [lowest, highest] or [lowest, highest, step], e.g. [0.3, 0.9]"
        )
    lo, hi = float(budget_range[0]), float(budget_range[1])
    step = float(budget_range[2]) if len(budget_range) == 3 else 0.1
    if not (0.0 < lo <= 1.0 and 0.0 < hi <= 1.0):
        raise ValueError(
            f"budget_range={list(budget_range)}: budgets are token fractions in (0, 1], e.g. [0.3, 0.9]"
        )
    if not lo < hi:
        raise ValueError(f"budget_range={list(budget_range)}: the lowest budget must be below the highest")
    if step <= 0:
        raise ValueError(f"budget_range={list(budget_range)}: the step {step:g} must be positive")
    count = int(round((hi - lo) / step))
    points = [round(lo + i * step, 6) for i in range(count + 1) if lo + i * step < hi - 1e-6]
    return [*points, hi]


class OperatingPoints(nn.Module):
    """Per budget point, the logit cut that makes the deterministic policy meet that mean budget.

    Args:
        budgets: the budget points, ascending (one point for a policy trained for one budget).
        momentum: weight of each new batch in the moving average of a point's cut.
    """

    def __init__(self, budgets: Sequence[float], momentum: float = 0.25) -> None:
        super().__init__()
        values = [float(b) for b in budgets]
        if not values or values != sorted(set(values)):
            raise ValueError(f"budget points {values} must be distinct and ascending")
        self.momentum = float(momentum)
        # the points are fixed when built (a checkpoint of other points is refused before it loads):
        # their range as Python floats, so checking a budget reads no device tensor (no host sync)
        self._range = (values[0], values[-1])
        self.register_buffer("budgets", torch.tensor(values))
        self.register_buffer("cuts", torch.zeros(len(values)))
        self.register_buffer("counts", torch.zeros(len(values), dtype=torch.long))
        self.register_buffer("spread_cuts", torch.zeros(len(values), SPREAD_CUTS))
        self.register_buffer("spread", torch.zeros(len(values), SPREAD_CUTS, SPREAD_QUANTILES))
        self.register_buffer("spread_counts", torch.zeros(len(values), dtype=torch.long))
        # cuts calibrated between the points (a conditioned policy's logits need not move evenly
        # between the budgets it was trained at: cuts interpolated linearly missed 0.45 by 0.05)
        self.register_buffer("between_cuts", torch.zeros(max(len(values) - 1, 0), BETWEEN))
        self.register_buffer("between_counts", torch.zeros(max(len(values) - 1, 0), dtype=torch.long))

    @property
    def range(self) -> tuple[float, float]:
        """Lowest and highest budget the policy was trained for."""
        return self._range

    @property
    def calibrated(self) -> bool:
        """Whether every point has seen at least one training batch."""
        return bool((self.counts > 0).all())

    def check(self, budget: float, setting: str = "budget") -> float:
        """``budget`` if the policy was trained for it, else a ValueError naming the trained range and
        the fix that fits: a budget-conditioned policy serves its range only (pick within it, or
        retrain with a wider one); a policy of one budget needs a conditioned one to serve others."""
        lo, hi = self.range
        if not lo - 1e-6 <= float(budget) <= hi + 1e-6:
            if hi > lo:
                fix = (
                    f"pick a budget from {lo:g} to {hi:g}, or retrain with a range that holds "
                    f"{float(budget):g} (model.init_args.budget_range: [lowest, highest])"
                )
                trained = f"[{lo:g}, {hi:g}] (a budget-conditioned policy)"
            else:
                fix = "train a budget-conditioned policy (model.init_args.budget_range: [lowest, highest]) to serve others"
                trained = f"{lo:g} only"
            raise ValueError(
                f"{setting}={float(budget):g}: this policy was trained for budgets {trained}; {fix}"
            )
        return float(budget)

    def cut(self, budget: Tensor, max_fraction: float | None = None) -> Tensor:
        """``(B,)`` logit cuts for ``(B,)`` budgets, linearly interpolated between points.

        Points never calibrated cut at logit 0 (p = 0.5), the untrained policy's natural threshold.
        ``max_fraction``: the hard cap, the most token fraction any image may keep (the cap's own
        rounding included); where a point's spread is known and the cap binds near its budget, its cut
        meets the budget under it.
        """
        cuts = torch.where(self.counts > 0, self.cuts, torch.zeros_like(self.cuts))
        if max_fraction is not None:
            cuts = torch.where(self.spread_counts > 0, self.capped_cuts(max_fraction, cuts), cuts)
        if cuts.numel() == 1:
            return cuts.expand(budget.shape).to(budget.device)
        budgets, cuts = self.table(cuts, torch.where(self.counts > 0, self.cuts, torch.zeros_like(self.cuts)))
        b = budget.float().clamp(budgets[0], budgets[-1])
        hi = torch.searchsorted(budgets, b).clamp(1, cuts.numel() - 1)
        lo = hi - 1
        w = (b - budgets[lo]) / (budgets[hi] - budgets[lo])
        return cuts[lo] + w * (cuts[hi] - cuts[lo])

    def between_budgets(self) -> Tensor:
        """``(points - 1, BETWEEN)``: the budgets calibrated between each two neighbouring points."""
        share = torch.arange(1, BETWEEN + 1, device=self.budgets.device) / (BETWEEN + 1)
        return self.budgets[:-1, None] + share * (self.budgets[1:] - self.budgets[:-1])[:, None]

    def table(self, cuts: Tensor, exact: Tensor) -> tuple[Tensor, Tensor]:
        """Every calibrated budget, ascending, and its cut: the points (``cuts``, a cap's correction
        included) and the budgets between them, those calibrated moved by the cap's correction of
        their neighbours (``cuts - exact``), the others interpolated."""
        share = (torch.arange(1, BETWEEN + 1, device=cuts.device) / (BETWEEN + 1))[None]
        mixed = cuts[:-1, None] * (1 - share) + cuts[1:, None] * share
        shift = (cuts - exact)[:-1, None] * (1 - share) + (cuts - exact)[1:, None] * share
        between = torch.where(self.between_counts[:, None] > 0, self.between_cuts + shift, mixed)
        budgets = torch.cat(
            [torch.cat([self.budgets[:-1, None], self.between_budgets()], 1).reshape(-1), self.budgets[-1:]]
        )
        return budgets, torch.cat([torch.cat([cuts[:-1, None], between], 1).reshape(-1), cuts[-1:]])

    def calibration_budgets(self) -> list[float]:
        """The budgets a calibration sample is read at: the points, then those between them."""
        return self.budgets.tolist() + self.between_budgets().reshape(-1).tolist()

    @torch.no_grad()
    def fit_sample(
        self,
        logits: Sequence[Sequence[Tensor]],
        reduce: Callable[[Tensor], Tensor] | None = None,
        finest: Sequence[int] | None = None,
    ) -> None:
        """Set every point (`fit`) and every budget between them from one calibration sample: ``logits[j]``
        are the per-level logits over the sample at ``calibration_budgets()[j]``; ``finest`` the finest
        grid (needed where the coarsest level does not divide it: `splitlab.tokenizer.fraction_of`)."""
        points = len(self.budgets)
        for point in range(points):
            self.fit(point, logits[point], reduce, finest)
        for j, budget in enumerate(self.between_budgets().reshape(-1).tolist()):
            self.between_cuts.view(-1)[j] = self._reduced(
                calibrate_threshold(logits[points + j], budget, finest=finest), reduce
            )
        self.between_counts += 1

    def index(self, budget: float) -> int:
        """The point nearest to ``budget``."""
        return int((self.budgets - float(budget)).abs().argmin())

    @torch.no_grad()
    def update(self, point: int, cut: float, reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        """Move point ``point``'s cut towards a batch's exact cut (its mean over ranks under DDP)."""
        value = self._reduced(cut, reduce)
        weight = 1.0 if int(self.counts[point]) == 0 else self.momentum
        self.cuts[point] += weight * (value - self.cuts[point])
        self.counts[point] += 1

    @torch.no_grad()
    def set(self, point: int, cut: float, reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        """Set point ``point``'s cut (computed on a whole calibration sample; mean over ranks)."""
        self.cuts[point] = self._reduced(cut, reduce)
        self.counts[point] += 1

    @torch.no_grad()
    def record_spread(
        self,
        point: int,
        logits: Sequence[Tensor],
        reduce: Callable[[Tensor], Tensor] | None = None,
        finest: Sequence[int] | None = None,
    ) -> None:
        """Keep point ``point``'s spread: on a calibration sample (``logits`` per non-finest level,
        ``(N, h, w)``), each image's fraction at `SPREAD_CUTS` cuts, from "split everything" up to
        the highest logit, as `SPREAD_QUANTILES` quantiles over the images (averaged over ranks)."""
        flat = torch.cat([lg.reshape(-1).float() for lg in logits])
        flat = flat[torch.isfinite(flat)].sort().values
        if flat.numel() == 0:
            return
        where = torch.linspace(0, flat.numel() - 1, SPREAD_CUTS - 1, device=flat.device).round().long()
        grid = torch.cat([flat[:1] - 1.0, flat[where]])  # ascending: fractions fall along it
        per_image = fractions_at(logits, grid, finest)  # (cuts, N)
        levels = (torch.arange(SPREAD_QUANTILES, device=flat.device) + 0.5) / SPREAD_QUANTILES
        spread = torch.quantile(per_image, levels, dim=1).T  # (cuts, quantiles)
        self.spread_cuts[point] = self._reduced(grid, reduce)
        self.spread[point] = self._reduced(spread, reduce)
        self.spread_counts[point] += 1

    @torch.no_grad()
    def fit(
        self,
        point: int,
        logits: Sequence[Tensor],
        reduce: Callable[[Tensor], Tensor] | None = None,
        finest: Sequence[int] | None = None,
    ) -> None:
        """Set point ``point`` from a whole calibration sample (``logits`` per non-finest level,
        ``(N, h, w)``): the cut whose layouts meet its budget on the sample, and the sample's spread,
        so that any cap given later meets it too. Training sets every point so before each
        validation; `splitlab.model.calibrate` on a user's own images."""
        self.set(point, calibrate_threshold(logits, float(self.budgets[point]), finest=finest), reduce)
        self.record_spread(point, logits, reduce, finest)

    def capped_cuts(self, max_fraction: float, exact: Tensor) -> Tensor:
        """Per point, the cut at which the calibration sample's layouts, each capped at ``max_fraction``, meet
        the point's budget on average: the capped mean fraction along the cut grid, interpolated
        linearly. Where the cap does not bind there, the exact cut (``exact``) stands. When the cap
        makes a budget unreachable, the lowest cut: every image split as far as the cap allows."""
        capped = self.spread.clamp(max=float(max_fraction)).mean(-1)  # (P, cuts), non-increasing
        free = self.spread.mean(-1)
        target = self.budgets[:, None].to(capped.dtype)
        below = capped <= target
        last = capped.shape[1] - 1
        first = torch.where(below.any(1), below.float().argmax(1), torch.full_like(self.counts, last))
        hi = first.clamp(1, last)[:, None]
        lo = hi - 1
        m_lo, m_hi = capped.gather(1, lo), capped.gather(1, hi)
        g_lo, g_hi = self.spread_cuts.gather(1, lo), self.spread_cuts.gather(1, hi)
        w = ((m_lo - target) / (m_lo - m_hi).clamp_min(1e-9)).clamp(0.0, 1.0)
        cut = (g_lo + w * (g_hi - g_lo)).squeeze(1)
        binds = ((m_lo < free.gather(1, lo) - 1e-6) | (m_hi < free.gather(1, hi) - 1e-6)).squeeze(1)
        return torch.where(binds, cut, exact)

    def _reduced(self, cut: float | Tensor, reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
        value = (
            cut.to(self.cuts.device)
            if isinstance(cut, Tensor)
            else torch.tensor(float(cut), device=self.cuts.device)
        )
        return reduce(value) if reduce is not None else value
