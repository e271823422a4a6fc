"""Baseline layouts that share the SPLIT walk: uniform, coarse, random and pixel entropy (APT).

Each baseline is a set of per-patch scores plus a threshold ("split where score > threshold"),
fed to the same quadtree walk as the learned policy, so comparisons are like for like.

``entropy`` is APT as APT does it (Choudhury et al. 2025, its ``compute_patch_entropy_batched``):
grayscale ``0.2989 R + 0.5870 G + 0.1140 B`` of pixels in ``[0, 255]``, quantised into 512 bins,
Shannon entropy in bits, and **one threshold per scale**: a patch of level ``k`` splits where
its entropy reaches ``t_k`` (APT's ``select_patches_by_threshold`` keeps it whole where entropy
< t). Larger patches have systematically higher entropy (measured on the generated images: 6.4
bits at 32 px, 6.0 at 16 px, 5.0 at 8 px), so one threshold for all levels (``entropy_single``,
kept for comparison) splits nearly every coarse patch first.

Where the per-level cuts come from:

- on each evaluation batch, for the same-backbone comparison rows: the same quantile of every
  level's entropies, that share found by a grid search over quantiles (`level_quantiles` +
  `calibrate_threshold`);
- for APT trained in the pipeline, fixed cuts in bits, either APT's own thresholds as configured
  (`cuts_from_thresholds`) or searched once on a calibration sample: the same-quantile slice
  (`level_thresholds`, ``apt_search: quantile``) or per-level cuts chosen for the lowest task
  loss at the budget (`search_level_cuts`, ``apt_search: metric``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.quadtree import fraction_of, fractions_at

BASELINES = ("uniform", "coarse", "random", "entropy", "entropy_single")
GRAY = (0.2989, 0.5870, 0.1140)  # APT's grayscale weights


def expected_random_fraction(rate: float, num_levels: int, finest: Sequence[int] | None = None) -> float:
    """Expected token fraction when every candidate splits independently with probability ``rate``, on
    a grid the coarsest level divides, or on the finest grid ``finest`` (clipped edge patches have
    fewer children, so their split adds fewer tokens)."""
    if finest is None:
        tokens = 1.0  # expected tokens of a finest-level patch
        for _ in range(num_levels - 1):
            tokens = (1.0 - rate) + rate * 4.0 * tokens
        return tokens / 4.0 ** (num_levels - 1)
    rows, cols = int(finest[0]), int(finest[1])
    expected = torch.ones(1, 1, rows, cols, dtype=torch.float64)  # each finest patch: one token
    for _ in range(num_levels - 1):  # a patch: itself, or the sum over its children (those that exist)
        children = F.avg_pool2d(expected, 2, ceil_mode=True, divisor_override=1)
        expected = (1.0 - rate) + rate * children
    return float(expected.sum()) / (rows * cols)


def random_split_rate(target: float, levels: Levels, finest: Sequence[int] | None = None) -> float:
    """The split probability whose expected token fraction is ``target`` (bisection; monotone), on a
    grid the coarsest level divides or on the finest grid ``finest``."""
    levels.check_fraction(target)
    if levels.num == 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_random_fraction(mid, levels.num, finest) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def grids_of(levels: Levels, batch: int, img_size: tuple[int, int]) -> list[tuple[int, int, int]]:
    """``(B, h_k, w_k)`` of each non-finest level."""
    return [(batch, *levels.grid(k, img_size)) for k in range(levels.num - 1)]


def patch_entropy(
    images: Tensor,
    patch: int,
    num_bins: int = 512,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Tensor:
    """Shannon entropy (bits) of the grayscale pixel histogram of each ``patch`` x ``patch`` patch, as APT.

    Args:
        images: ``(B, 3, H, W)``; normalised with ``mean``/``std`` when given, else in ``[0, 1]``.
        patch: patch side in pixels.
        num_bins: histogram bins over the grayscale range ``[0, 256)`` of 8-bit pixels (APT: 512).

    Returns:
        ``(B, ceil(H / patch), ceil(W / patch))`` entropies (a patch at the right or bottom edge that the
        image cuts short: of the pixels it has).
    """
    x = images.float()
    if mean is not None and std is not None:
        m = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
        s = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
        x = x * s + m
    x = (x * 255.0).clamp(0, 255)
    gray = x[:, 0] if x.shape[1] == 1 else sum(w * x[:, c] for c, w in enumerate(GRAY))
    bins = (gray * (num_bins / 256.0)).long().clamp(0, num_bins - 1)
    b, h, w = bins.shape
    rows, cols = -(-h // patch), -(-w // patch)
    ys = torch.arange(h, device=x.device) // patch
    xs = torch.arange(w, device=x.device) // patch
    patch_id = (ys[:, None] * cols + xs[None, :]).expand(b, h, w)
    image_id = torch.arange(b, device=x.device).view(b, 1, 1) * (rows * cols)
    flat = ((image_id + patch_id) * num_bins + bins).reshape(-1)
    counts = torch.bincount(flat, minlength=b * rows * cols * num_bins).view(b, rows, cols, num_bins).float()
    p = counts / counts.sum(-1, keepdim=True)
    return -(torch.where(p > 0, p * torch.log2(p), torch.zeros_like(p))).sum(-1)


def entropy_scores(
    images: Tensor,
    levels: Levels,
    num_bins: int = 512,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> list[Tensor]:
    """Pixel-entropy score of every non-finest patch (APT's split criterion), of the pixels under whole
    finest patches (those the backbone reads)."""
    levels.check_image(images.shape[-2:])
    rows, cols = levels.finest_grid(images.shape[-2:])
    images = images[..., : rows * levels.finest, : cols * levels.finest]
    return [patch_entropy(images, levels.sizes[k], num_bins, mean, std) for k in range(levels.num - 1)]


def level_quantiles(scores: Sequence[Tensor]) -> list[Tensor]:
    """Each score's quantile within its own level (over the batch), in ``(0, 1)``.

    One threshold on these is one quantile threshold per level: every level splits the same
    share of its patches, whatever the scale of its raw scores.
    """
    out = []
    for level in scores:
        flat = level.reshape(-1).float().contiguous()
        ordered = flat.sort().values
        below = torch.searchsorted(ordered, flat, right=False)
        upto = torch.searchsorted(ordered, flat, right=True)
        out.append(((below + upto).float() / (2 * flat.numel())).view_as(level))  # ties share a quantile
    return out


def random_scores(
    levels: Levels,
    batch: int,
    img_size: tuple[int, int],
    device: torch.device,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Uniform(0, 1) scores: with threshold ``1 - rate`` each candidate splits with probability ``rate``."""
    return [
        torch.rand(shape, device=device, generator=generator) for shape in grids_of(levels, batch, img_size)
    ]


def calibrate_threshold(
    scores: Sequence[Tensor],
    target: float,
    rounds: int = 2,
    points: int = 257,
    finest: Sequence[int] | None = None,
) -> float:
    """The threshold whose layouts ("split where score > t") have mean token fraction closest to ``target``
    (of the ``finest`` grid: needed where the coarsest level does not divide it, see `fraction_of`).

    Fraction falls monotonically with the threshold, so a grid of quantiles of the scores is
    searched, then the gap around the best one, all candidates at once.
    """
    if not scores:
        return 0.0
    flat = torch.cat([s.reshape(-1).float() for s in scores])
    flat = flat[torch.isfinite(flat)]
    if flat.numel() == 0:
        return 0.0
    values = flat.sort().values
    idx = torch.linspace(0, values.numel() - 1, points, device=values.device).round().long()
    candidates = torch.cat([values[idx], values[:1] - 1.0])
    best = candidates[0]
    for _ in range(rounds):
        candidates = candidates.unique()
        fractions = fractions_at(scores, candidates, finest).mean(-1)
        error = (fractions - target).abs()
        i = int(error.argmin())
        best = candidates[i]
        lo = candidates[max(i - 1, 0)]
        hi = candidates[min(i + 1, candidates.numel() - 1)]
        candidates = torch.linspace(float(lo), float(hi), points, device=values.device)
    return float(best)


def level_thresholds(scores: Sequence[Tensor], target: float, finest: Sequence[int] | None = None) -> Tensor:
    """APT's fixed per-level thresholds: raw entropy cuts, one per level, that meet ``target`` on a
    calibration sample (``scores``: each level's entropies over the sample).

    The cut is the same quantile of every level (as on a batch, `calibrate_threshold` over
    `level_quantiles`), turned into each level's raw entropy: split where entropy > cut. Fixed
    cuts make an image's layout its own, whatever else is in its batch (a batch of one image
    calibrated alone would get the target fraction whatever its content).
    """
    ranks = level_quantiles(scores)
    share = calibrate_threshold(ranks, target, finest=finest)
    cuts = []
    for level, rank in zip(scores, ranks, strict=True):
        kept = level.float()[rank <= share]  # those the quantile cut leaves coarse
        cuts.append(kept.max() if kept.numel() else level.float().min() - 1.0)
    return torch.stack(cuts)


APT_SEARCHES = ("metric", "quantile")  # how APT trained in the pipeline finds its cuts without thresholds
# A searched candidate may miss the budget on the calibration sample by this much (or by as much as
# the same-quantile cuts do, where the entropies' ties make the fraction jump), and may not take more
# tokens than the budget plus this or the same-quantile cuts: a looser bound would let the loss
# prefer whichever candidate spends more tokens.
FRACTION_TOLERANCE = 0.005


def check_entropy_thresholds(
    thresholds: Sequence[float], levels: Levels, setting: str = "entropy_thresholds"
) -> list[float]:
    """APT's thresholds as floats if there is one per level coarser than the finest, else a one-line error."""
    values = [float(t) for t in thresholds]
    want, coarse = levels.num - 1, list(levels.sizes[:-1])
    if len(values) != want:
        raise ValueError(
            f"{setting}={values}: expected {want} value{'s' * (want != 1)} in bits, one per level coarser "
            f"than the finest, coarse to fine (levels={list(levels.sizes)}: the cuts of its {coarse} px patches)"
        )
    if any(math.isnan(v) for v in values):
        raise ValueError(f"{setting}={values}: a threshold is NaN; give bits (inf never splits that level)")
    return values


def cuts_from_thresholds(thresholds: Sequence[float], levels: Levels) -> Tensor:
    """APT's per-level thresholds (bits, coarse to fine) as the walk's cuts ("split where entropy > cut").

    APT keeps a patch whole where its entropy is below the threshold (``select_patches_by_threshold``:
    ``entropy < t``), so a patch *at* the threshold splits; the cut is therefore the float32 just
    below it. Entropies often sit exactly on whole bits (a patch of two equally frequent gray values
    has 1 bit), where the two conventions would differ.
    """
    values = torch.tensor(check_entropy_thresholds(thresholds, levels), dtype=torch.float32)
    return torch.nextafter(values, torch.full_like(values, -math.inf))


def layout_fraction(scores: Sequence[Tensor], cuts: Tensor, finest: Sequence[int] | None = None) -> Tensor:
    """Token fraction per image (of the ``finest`` grid) of splitting where each level's score exceeds its cut."""
    decisions = [s.float() > c for s, c in zip(scores, cuts.to(scores[0].device), strict=True)]
    return fraction_of(decisions, finest)


def share_cut(level: Tensor, share: float) -> Tensor:
    """The cut that splits (at most, ties stay together) ``share`` of ``level``'s patches."""
    ordered = level.reshape(-1).float().sort().values
    whole = min(max(round((1.0 - share) * ordered.numel()), 0), ordered.numel())
    return ordered[0] - 1.0 if whole == 0 else ordered[whole - 1]


def solve_level_cut(
    scores: Sequence[Tensor], cuts: Tensor, level: int, target: float, finest: Sequence[int] | None = None
) -> Tensor:
    """``cuts`` with level ``level``'s cut the one whose mean fraction is closest to ``target``, the other
    levels' decisions held (`calibrate_threshold` over that level's scores alone)."""
    inf = torch.tensor(math.inf, device=scores[0].device)
    held = [
        s.float() if k == level else torch.where(s.float() > c, inf, -inf)
        for k, (s, c) in enumerate(zip(scores, cuts.to(inf.device), strict=True))
    ]
    solved = cuts.clone()
    solved[level] = calibrate_threshold(held, target, finest=finest)
    return solved


def share_range(
    scores: Sequence[Tensor],
    cuts: Tensor,
    level: int,
    target: float,
    tolerance: float,
    steps: int = 30,
    finest: Sequence[int] | None = None,
) -> tuple[float, float]:
    """The shares of ``level``'s patches that may split with the budget still reachable by the finest
    non-finest level (all of it split at the low end, none at the high end); bisection, as the
    fraction grows with the share."""
    last = len(scores) - 1

    def fraction(share: float, solved: float) -> float:
        trial = cuts.clone()
        trial[level] = share_cut(scores[level], share)
        trial[last] = solved
        return float(layout_fraction(scores, trial, finest).mean())

    def boundary(ok: Callable[[float], bool], upward: bool) -> float:
        lo, hi = 0.0, 1.0  # ok(share) switches once along [0, 1]: the last share on its ok side
        for _ in range(steps):
            mid = 0.5 * (lo + hi)
            if ok(mid) == upward:
                hi = mid
            else:
                lo = mid
        return hi if upward else lo

    low = boundary(lambda s: fraction(s, -math.inf) >= target - tolerance, upward=True)
    high = boundary(lambda s: fraction(s, math.inf) <= target + tolerance, upward=False)
    return low, high


def search_level_cuts(
    scores: Sequence[Tensor],
    target: float,
    evaluate: Callable[[list[Tensor]], Tensor],
    shares: int = 9,
    tolerance: float = FRACTION_TOLERANCE,
    finest: Sequence[int] | None = None,
) -> tuple[Tensor, list[dict[str, float | list[float] | bool]]]:
    """APT's per-level cuts with the lowest task loss at ``target``, searched on a calibration sample.

    The budget fixes one cut given the others, so the search has one free cut fewer than the
    non-finest levels: for each coarser level in turn (coordinate descent, one pass), ``shares``
    shares of its patches to split, spread over the range where the budget stays reachable; the
    finest non-finest level's cut is then solved to meet the budget (`solve_level_cut`). The
    same-quantile cuts (`level_thresholds`) are the first candidate, so the search keeps them
    unless another candidate meets the budget as well and has a lower loss.

    Args:
        scores: each non-finest level's entropies over the calibration sample.
        target: the mean token fraction to meet.
        evaluate: the mean task loss of each candidate's layouts on the sample (the same on every
            rank: reduce it before returning), one call per coordinate pass.
        shares: candidates per free level.
        tolerance: see ``FRACTION_TOLERANCE``.
        finest: the finest grid (where the coarsest level does not divide it: `fraction_of`).

    Returns:
        The chosen cuts and one record per evaluated candidate (cuts, fraction, loss, whether it
        met the budget, whether it was chosen; the first is the same-quantile one).
    """
    best = level_thresholds(scores, target, finest)
    if len(scores) < 2:  # one non-finest level: the budget alone fixes its cut
        return best, []
    reference = float(layout_fraction(scores, best, finest).mean())
    slack = max(tolerance, abs(reference - target))
    ceiling = max(target + tolerance, reference)
    records: list[dict[str, float | list[float] | bool]] = []
    best_loss = math.inf
    for level in range(len(scores) - 1):
        low, high = share_range(scores, best, level, target, tolerance, finest=finest)
        candidates = [best] if not records else []
        for share in torch.linspace(low, high, shares).tolist() if low <= high else []:
            trial = best.clone()
            trial[level] = share_cut(scores[level], share)
            trial = solve_level_cut(scores, trial, len(scores) - 1, target, finest)
            if not any(torch.equal(trial, c) for c in candidates) and not torch.equal(trial, best):
                candidates.append(trial)
        if not candidates:
            continue
        losses = evaluate(candidates).float().cpu()
        for cuts, loss in zip(candidates, losses.tolist(), strict=True):
            fraction = float(layout_fraction(scores, cuts, finest).mean())
            met = abs(fraction - target) <= slack and fraction <= ceiling
            records.append(
                {"cuts": cuts.tolist(), "fraction": fraction, "loss": loss, "met": met, "chosen": False}
            )
            if met and loss < best_loss:
                best, best_loss = cuts, loss
    for record in records:
        record["chosen"] = record["cuts"] == best.tolist()
    return best, records


def baseline_scores(
    name: str,
    images: Tensor,
    levels: Levels,
    budget: float | None = None,
    entropy_threshold: float | None = None,
    generator: torch.Generator | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> tuple[list[Tensor], float]:
    """Scores and threshold of a baseline layout, for the walk's ``scores`` mode.

    Args:
        name: ``uniform``, ``coarse``, ``random``, ``entropy`` (APT: a threshold per level) or
            ``entropy_single`` (one threshold for every level).
        images: the batch (its size fixes the grids; entropy reads its pixels).
        levels: the quadtree.
        budget: the target token fraction (``random``: met in expectation; ``entropy``: met on this
            batch when ``entropy_threshold`` is not given).
        entropy_threshold: a fixed threshold (``entropy_single``: in bits; ``entropy``: on the level
            quantiles), e.g. from `calibrate_threshold` over a sample.
        mean, std: the normalisation of ``images``, to recover pixel values for ``entropy``.
    """
    batch, img_size, device = images.shape[0], tuple(images.shape[-2:]), images.device
    levels.check_image(img_size)
    shapes = grids_of(levels, batch, img_size)
    finest = levels.finest_grid(img_size)
    if name == "uniform":
        return [torch.ones(s, device=device) for s in shapes], 0.0
    if name == "coarse":
        return [torch.zeros(s, device=device) for s in shapes], 0.0
    if name == "random":
        if budget is None:
            raise ValueError("the random baseline needs a budget")
        rate = random_split_rate(budget, levels, finest if levels.clipped(finest) else None)
        return random_scores(levels, batch, img_size, device, generator), 1.0 - rate
    if name in ("entropy", "entropy_single"):
        scores = entropy_scores(images, levels, mean=mean, std=std)
        if name == "entropy":
            scores = level_quantiles(scores)
        if entropy_threshold is None:
            if budget is None:
                raise ValueError("the entropy baseline needs a budget or an entropy_threshold")
            entropy_threshold = calibrate_threshold(scores, levels.check_fraction(budget), finest=finest)
        return scores, entropy_threshold
    raise ValueError(f"unknown baseline {name!r}; expected one of {BASELINES}")
