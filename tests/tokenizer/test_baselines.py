"""Baseline layouts: uniform, coarse, random and pixel entropy (APT)."""

from __future__ import annotations

import math

import pytest
import torch

from splitlab.tokenizer import (
    Levels,
    baseline_scores,
    calibrate_threshold,
    expected_random_fraction,
    fraction_of,
    patch_entropy,
    random_split_rate,
)


def direct_entropy(gray: torch.Tensor, bins: int = 512) -> float:
    """APT's rule, worked directly: grayscale of 8-bit pixels, ``bins`` bins over [0, 256), bits."""
    q = (gray * 255 * bins / 256).long().clamp(0, bins - 1).flatten()
    counts = torch.bincount(q, minlength=bins).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log2()).sum())


def test_entropy_on_hand_made_images() -> None:
    img = torch.zeros(1, 3, 32, 64)
    img[..., :, :32] = 0.4  # flat patch -> 0 bits
    img[..., :16, 32:] = 0.0  # half black, half white -> 1 bit
    img[..., 16:, 32:] = 1.0
    ent = patch_entropy(img, 32)
    assert ent.shape == (1, 1, 2)
    assert ent[0, 0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert ent[0, 0, 1].item() == pytest.approx(1.0, abs=1e-6)
    quarters = torch.tensor([0.0, 0.3, 0.6, 0.9]).repeat_interleave(4).view(1, 1, 4, 4).expand(1, 3, 4, 4)
    assert patch_entropy(quarters, 4)[0, 0, 0].item() == pytest.approx(2.0, abs=1e-6)


def test_entropy_matches_a_direct_histogram() -> None:
    gen = torch.Generator().manual_seed(0)
    img = torch.rand(2, 3, 64, 64, generator=gen) ** 2
    gray = 0.2989 * img[:, 0] + 0.5870 * img[:, 1] + 0.1140 * img[:, 2]  # APT's weights
    ent = patch_entropy(img, 16)
    for b in range(2):
        for i in range(4):
            for j in range(4):
                want = direct_entropy(gray[b, 16 * i : 16 * i + 16, 16 * j : 16 * j + 16])
                assert ent[b, i, j].item() == pytest.approx(want, abs=1e-4)


def test_entropy_undoes_normalisation() -> None:
    img = torch.zeros(1, 3, 16, 16)
    img[..., 8:, :] = 1.0
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    normed = (img - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert patch_entropy(normed, 16, mean=mean, std=std)[0, 0, 0].item() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("levels", [(32, 16), (64, 32, 16), (128, 64, 32, 16)])
@pytest.mark.parametrize("target", [0.3, 0.5, 0.7, 0.95])
def test_random_rate_meets_the_target_in_expectation(levels, target) -> None:
    lv = Levels(levels)
    if target < lv.min_fraction:
        pytest.skip("unreachable")
    rate = random_split_rate(target, lv)
    assert expected_random_fraction(rate, lv.num) == pytest.approx(target, abs=1e-9)
    scores, threshold = baseline_scores(
        "random",
        torch.zeros(400, 3, 128, 128),
        lv,
        budget=target,
        generator=torch.Generator().manual_seed(0),
    )
    assert fraction_of([s > threshold for s in scores]).mean().item() == pytest.approx(target, abs=0.02)


def test_uniform_and_coarse_extremes() -> None:
    lv = Levels((64, 32, 16))
    x = torch.zeros(2, 3, 128, 64)
    for name, want in [("uniform", 1.0), ("coarse", 1 / 16)]:
        scores, t = baseline_scores(name, x, lv)
        assert torch.allclose(fraction_of([s > t for s in scores]), torch.full((2,), want))


def test_entropy_threshold_calibration_meets_the_target() -> None:
    lv = Levels((64, 32, 16))
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(16, 3, 128, 128, generator=gen) * torch.rand(16, 1, 1, 1, generator=gen)
    x[:, :, :64] = 0.5 * x[:, :, :64].round()
    scores, t = baseline_scores("entropy", x, lv, budget=0.5)
    achieved = fraction_of([s > t for s in scores]).mean().item()
    assert achieved == pytest.approx(0.5, abs=0.03)
    # a threshold calibrated on the batch is the one the helper returns for the same scores
    assert calibrate_threshold(scores, 0.5) == pytest.approx(t)


def test_apt_thresholds_are_per_level_not_one_for_all() -> None:
    """Coarse patches hold more distinct pixel values, so their entropy is higher everywhere: one
    threshold for all levels splits every coarse patch before any fine one; APT's per-level
    thresholds split the same share of each level."""
    import numpy as np

    from splitlab.data.generators.shapes import CLASSES, render

    rng = np.random.default_rng(0)
    pictures = [render(CLASSES[i % 4], rng, 128)[0] for i in range(16)]  # the generated shapes data
    x = torch.from_numpy(np.stack(pictures)).permute(0, 3, 1, 2).float() / 255
    lv = Levels((64, 32, 16))
    raw = [s.flatten() for s in baseline_scores("entropy_single", x, lv, budget=0.5)[0]]
    assert raw[0].mean() > raw[1].mean() + 0.2  # 64 px patches: more entropy than 32 px ones
    single, t_single = baseline_scores("entropy_single", x, lv, budget=0.5)
    apt, t_apt = baseline_scores("entropy", x, lv, budget=0.5)
    share = [(s > t_apt).float().mean().item() for s in apt]
    assert share[0] == pytest.approx(share[1], abs=0.03)  # the same quantile per level
    # one threshold for all levels spends the budget on coarse splits first
    assert (single[0] > t_single).float().mean().item() >= share[0] + 0.2
    for scores, t in ((single, t_single), (apt, t_apt)):
        assert fraction_of([s > t for s in scores]).mean().item() == pytest.approx(0.5, abs=0.03)


def test_unknown_baseline_and_missing_fraction() -> None:
    lv = Levels((32, 16))
    with pytest.raises(ValueError, match="unknown baseline 'apt'"):
        baseline_scores("apt", torch.zeros(1, 3, 32, 32), lv)
    with pytest.raises(ValueError, match="needs a budget"):
        baseline_scores("random", torch.zeros(1, 3, 32, 32), lv)
    with pytest.raises(ValueError, match="budget=0.1 is outside"):
        baseline_scores("random", torch.zeros(1, 3, 32, 32), lv, budget=0.1)
    assert math.isfinite(random_split_rate(1.0, lv))


def test_apt_fixed_cuts_reproduce_the_calibrated_sample_and_judge_each_image_alone() -> None:
    """The per-level cuts set on a sample give that sample the layouts of the quantile calibration
    (so its fraction), and then decide each image by its own entropies."""
    from splitlab.tokenizer import calibrate_threshold, entropy_scores, level_quantiles, level_thresholds
    from splitlab.tokenizer.quadtree import fraction_of

    levels = Levels.build((32, 16, 8))
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(16, 3, 64, 64, generator=gen) ** torch.linspace(0.2, 4, 16).view(-1, 1, 1, 1)
    scores = entropy_scores(images, levels)
    cuts = level_thresholds(scores, 0.5)
    ranks = level_quantiles(scores)
    share = calibrate_threshold(ranks, 0.5)
    fixed = [s > c for s, c in zip(scores, cuts, strict=True)]
    assert all(torch.equal(f, r > share) for f, r in zip(fixed, ranks, strict=True))
    assert float(fraction_of(fixed).mean()) == pytest.approx(0.5, abs=0.03)
    alone = [s[:1] > c for s, c in zip(scores, cuts, strict=True)]
    assert all(torch.equal(a, f[:1]) for a, f in zip(alone, fixed, strict=True))
    per_image = fraction_of(fixed)
    assert float(per_image.max() - per_image.min()) > 0.2  # busy images take more tokens, as APT's


def hand_made_quadrants() -> torch.Tensor:
    """A 64 px image whose 32 px quadrants have entropies known by hand (pixels in [0, 1], gray):

    - top left: flat, 0 bits at every scale;
    - top right: a one-pixel checkerboard of two values, 1 bit in every 32 and 16 px patch;
    - bottom left: four values tiled 2x2, 2 bits in every 32 and 16 px patch;
    - bottom right: flat left half, checkerboard right half: its 32 px patch holds one value on
      3/4 of its pixels, the other on 1/4, so -(3/4 log2 3/4 + 1/4 log2 1/4) = 0.811 bits; its
      16 px children are flat (0 bits) on the left, checkerboards (1 bit) on the right.
    """
    img = torch.zeros(1, 3, 64, 64)
    yy, xx = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    checker = ((yy + xx) % 2).float()
    img[:, :, :32, 32:] = checker
    img[:, :, 32:, :32] = ((yy % 2) * 2 + (xx % 2)).float() / 3  # 0, 1/3, 2/3, 1: distinct bins
    img[:, :, 32:, 48:] = checker[:, 16:]
    return img


def test_apt_thresholds_from_the_setting_are_used_as_given() -> None:
    """APT's thresholds in bits, coarse to fine, split where entropy reaches the threshold (APT keeps a
    patch whole where entropy < t): the layouts worked by hand on `hand_made_quadrants`."""
    from splitlab.tokenizer import entropy_scores
    from splitlab.tokenizer.baselines import cuts_from_thresholds, layout_fraction

    levels = Levels.build((32, 16, 8))
    scores = entropy_scores(hand_made_quadrants(), levels)
    assert scores[0][0].flatten().tolist() == pytest.approx([0.0, 1.0, 2.0, 0.811278], abs=1e-5)
    assert scores[1][0, 2:, 2:].tolist() == [[0.0, 1.0], [0.0, 1.0]]
    # [1, 1]: the 1 bit and 2 bit quadrants split (1 bit: at the threshold), then all 8 of their
    # children (1 and 2 bits); the flat and the 0.811 bit quadrants stay whole: 1 + 1 + 16 + 16 tokens
    # [1, 1.5]: the checkerboard's 1 bit children stay whole: 1 + 1 + 4 + 16
    # [0.8, 1.5]: the 0.811 bit quadrant splits too, none of its children: 1 + 4 + 4 + 16
    for thresholds, tokens in (([1.0, 1.0], 34), ([1.0, 1.5], 22), ([0.8, 1.5], 25), ([0.0, 0.0], 64)):
        cuts = cuts_from_thresholds(thresholds, levels)
        assert float(layout_fraction(scores, cuts)) == tokens / 64, thresholds
    assert cuts_from_thresholds([5.5, 4.0], levels).tolist() == pytest.approx([5.5, 4.0])


@pytest.mark.parametrize("thresholds", [[5.5], [6.0, 5.0, 4.0], []])
def test_apt_thresholds_of_the_wrong_length_are_refused(thresholds) -> None:
    from splitlab.tokenizer.baselines import cuts_from_thresholds

    with pytest.raises(ValueError, match=r"entropy_thresholds=.*: expected 2 values in bits, one per level"):
        cuts_from_thresholds(thresholds, Levels.build((32, 16, 8)))
    with pytest.raises(ValueError, match="a threshold is NaN"):
        cuts_from_thresholds([math.nan, 1.0], Levels.build((32, 16, 8)))


def busy_sample(count: int = 64) -> list[torch.Tensor]:
    """Per-level entropies of images from flat to busy."""
    from splitlab.tokenizer import entropy_scores

    gen = torch.Generator().manual_seed(3)
    images = torch.rand(count, 3, 64, 64, generator=gen) ** torch.linspace(0.2, 6, count).view(-1, 1, 1, 1)
    return entropy_scores(images, Levels.build((32, 16, 8)))


def test_metric_search_picks_the_per_level_cuts_with_the_lowest_loss() -> None:
    """A loss that pays for every 32 px patch left whole: the best layouts at the budget split as many
    coarse patches as the budget allows and fewer fine ones, not the same share of both levels."""
    from splitlab.tokenizer.baselines import (
        layout_fraction,
        level_thresholds,
        search_level_cuts,
        share_cut,
        solve_level_cut,
    )

    scores, target = busy_sample(), 0.5
    calls: list[int] = []

    def loss(cuts: torch.Tensor) -> float:
        return float((scores[0] <= cuts[0]).float().mean())  # share of coarse patches left whole

    def evaluate(candidates: list[torch.Tensor]) -> torch.Tensor:
        calls.append(len(candidates))
        return torch.tensor([loss(c) for c in candidates])

    cuts, records = search_level_cuts(scores, target, evaluate)
    quantile = level_thresholds(scores, target)
    assert calls == [10]  # the same-quantile cuts and 9 shares, in one pass
    assert records[0]["cuts"] == quantile.tolist() and not records[0]["chosen"]
    assert float(layout_fraction(scores, cuts).mean()) == pytest.approx(target, abs=0.005)
    assert loss(cuts) < loss(quantile) - 0.1
    chosen = [r for r in records if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["loss"] == min(r["loss"] for r in records if r["met"])
    # worked exhaustively: every coarse cut, the fine cut solved for the budget: none meeting it is better
    best = math.inf
    for share in torch.linspace(0, 1, 257).tolist():
        trial = quantile.clone()
        trial[0] = share_cut(scores[0], share)
        trial = solve_level_cut(scores, trial, 1, target)
        if abs(float(layout_fraction(scores, trial).mean()) - target) <= 0.005:
            best = min(best, loss(trial))
    assert loss(cuts) == pytest.approx(best, abs=1 / 64)


def test_metric_search_keeps_the_same_quantile_cuts_when_nothing_is_better() -> None:
    from splitlab.tokenizer.baselines import level_thresholds, search_level_cuts

    scores = busy_sample()
    cuts, records = search_level_cuts(scores, 0.5, lambda c: torch.ones(len(c)))
    assert torch.equal(cuts, level_thresholds(scores, 0.5)) and records[0]["chosen"]
    more = search_level_cuts(scores, 0.5, lambda c: -torch.tensor([float(x[1]) for x in c]))[0]
    assert not torch.equal(more, cuts)  # a loss that wants a low fine cut moves it
