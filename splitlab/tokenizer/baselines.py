"""Baseline layouts that share the SPLIT walk: uniform, coarse, random and pixel entropy (APT).

Each baseline is a set of per-patch scores plus a threshold ("split where score > threshold"),
fed to the same quadtree walk as the learned policy, so comparisons are like for like.

``entropy`` is APT as APT does it (Choudhury et al. 2025, its ``compute_patch_entropy_batched``):
grayscale ``0.2989 R + 0.5870 G + 0.1140 B`` of pixels in ``[0, 255]``, quantised into 512 bins,
Shannon entropy in bits, and **one threshold per scale**: a patch of level ``k`` splits where
its entropy exceeds ``t_k``. Larger patches have systematically higher entropy (measured on the
generated images: 6.4 bits at 32 px, 6.0 at 16 px, 5.0 at 8 px), so one threshold for all levels
(``entropy_single``, the old baseline) splits nearly every coarse patch first. To meet a target
fraction the per-level thresholds are the same quantile of each level's entropies (every level
splits the same share of its patches), that share found by a grid search over quantiles,
refined around the best (`level_quantiles` + `calibrate_threshold`): on each evaluation batch for
the same-backbone comparison rows, once on a calibration sample for APT trained in the pipeline
(`level_thresholds`, fixed cuts as APT's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.quadtree import fraction_of

BASELINES = ("uniform", "coarse", "random", "entropy", "entropy_single")
GRAY = (0.2989, 0.5870, 0.1140)  # APT's grayscale weights


def expected_random_fraction(rate: float, num_levels: int) -> float:
    """Expected token fraction when every candidate splits independently with probability ``rate``."""
    tokens = 1.0  # expected tokens of a finest-level patch
    for _ in range(num_levels - 1):
        tokens = (1.0 - rate) + rate * 4.0 * tokens
    return tokens / 4.0 ** (num_levels - 1)


def random_split_rate(target: float, levels: Levels) -> float:
    """The split probability whose expected token fraction is ``target`` (bisection; monotone)."""
    levels.check_fraction(target)
    if levels.num == 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_random_fraction(mid, levels.num) < target:
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
        ``(B, H / patch, W / patch)`` entropies.
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
    rows, cols = h // patch, w // patch
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
    """Pixel-entropy score of every non-finest patch (APT's split criterion)."""
    levels.check_image(images.shape[-2:])
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


CANDIDATES_AT_ONCE = 16  # bounds calibration's memory: all 257 at once took 6 GB on 512 COCO images


def calibrate_threshold(scores: Sequence[Tensor], target: float, rounds: int = 2, points: int = 257) -> float:
    """The threshold whose layouts ("split where score > t") have mean token fraction closest to ``target``.

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
        fractions = torch.cat(  # a few candidates at a time: each is a (B, h, w) mask per level
            [
                fraction_of([s.float()[None] > t.view(-1, 1, 1, 1) for s in scores]).mean(-1)
                for t in candidates.split(CANDIDATES_AT_ONCE)
            ]
        )
        error = (fractions - target).abs()
        i = int(error.argmin())
        best = candidates[i]
        lo = candidates[max(i - 1, 0)]
        hi = candidates[min(i + 1, candidates.numel() - 1)]
        candidates = torch.linspace(float(lo), float(hi), points, device=values.device)
    return float(best)


def level_thresholds(scores: Sequence[Tensor], target: float) -> Tensor:
    """APT's fixed per-level thresholds: raw entropy cuts, one per level, that meet ``target`` on a
    calibration sample (``scores``: each level's entropies over the sample).

    The cut is the same quantile of every level (as on a batch, `calibrate_threshold` over
    `level_quantiles`), turned into each level's raw entropy: split where entropy > cut. Fixed
    cuts make an image's layout its own, whatever else is in its batch (a batch of one image
    calibrated alone would get the target fraction whatever its content).
    """
    ranks = level_quantiles(scores)
    share = calibrate_threshold(ranks, target)
    cuts = []
    for level, rank in zip(scores, ranks, strict=True):
        kept = level.float()[rank <= share]  # those the quantile cut leaves coarse
        cuts.append(kept.max() if kept.numel() else level.float().min() - 1.0)
    return torch.stack(cuts)


def baseline_scores(
    name: str,
    images: Tensor,
    levels: Levels,
    fraction: float | None = None,
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
        fraction: target token fraction (``random``: met in expectation; ``entropy``: met on this
            batch when ``entropy_threshold`` is not given).
        entropy_threshold: a fixed threshold (``entropy_single``: in bits; ``entropy``: on the level
            quantiles), e.g. from `calibrate_threshold` over a sample.
        mean, std: the normalisation of ``images``, to recover pixel values for ``entropy``.
    """
    batch, img_size, device = images.shape[0], tuple(images.shape[-2:]), images.device
    levels.check_image(img_size)
    shapes = grids_of(levels, batch, img_size)
    if name == "uniform":
        return [torch.ones(s, device=device) for s in shapes], 0.0
    if name == "coarse":
        return [torch.zeros(s, device=device) for s in shapes], 0.0
    if name == "random":
        if fraction is None:
            raise ValueError("the random baseline needs a target fraction")
        rate = random_split_rate(fraction, levels)
        return random_scores(levels, batch, img_size, device, generator), 1.0 - rate
    if name in ("entropy", "entropy_single"):
        scores = entropy_scores(images, levels, mean=mean, std=std)
        if name == "entropy":
            scores = level_quantiles(scores)
        if entropy_threshold is None:
            if fraction is None:
                raise ValueError("the entropy baseline needs a target fraction or an entropy_threshold")
            entropy_threshold = calibrate_threshold(scores, levels.check_fraction(fraction))
        return scores, entropy_threshold
    raise ValueError(f"unknown baseline {name!r}; expected one of {BASELINES}")
