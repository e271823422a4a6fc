"""Token budgets: budget points, calibrated operating points, the hard per-image cap, conditioning."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab.tokenizer import (
    OperatingPoints,
    SplitTokenizer,
    budget_points,
    calibrate_threshold,
    cap_splits,
    count_tokens,
    leaf_masks,
)


def test_budget_points_span_the_range() -> None:
    assert budget_points([0.3, 0.7]) == pytest.approx([0.3, 0.4, 0.5, 0.6, 0.7])
    assert budget_points([0.3, 0.75, 0.2]) == pytest.approx([0.3, 0.5, 0.7, 0.75])
    with pytest.raises(
        ValueError, match=r"budget_range=\[0.5\]: give \[lowest, highest\] or \[lowest, highest, step\]"
    ):
        budget_points([0.5])
    with pytest.raises(ValueError, match="the lowest budget must be below the highest"):
        budget_points([0.7, 0.3])
    with pytest.raises(ValueError, match=r"budget_range=\[0.3, 0.7, 0\]: the step 0 must be positive"):
        budget_points([0.3, 0.7, 0])


def test_operating_points_interpolate_and_name_the_trained_range() -> None:
    points = OperatingPoints([0.3, 0.5, 0.7], momentum=0.5)
    budgets = torch.tensor([0.3, 0.4, 0.7])
    assert torch.equal(points.cut(budgets), torch.zeros(3))  # never calibrated: p > 0.5
    points.update(0, 2.0)
    points.update(1, 1.0)
    points.update(2, -1.0)
    assert points.calibrated
    assert points.cut(budgets).tolist() == pytest.approx([2.0, 1.5, -1.0])
    points.update(1, 3.0)  # moving average: half way
    assert float(points.cuts[1]) == pytest.approx(2.0)
    points.update(1, 4.0, reduce=lambda t: t * 0 + 2.0)  # the cross-rank mean is what counts
    assert float(points.cuts[1]) == pytest.approx(2.0)
    assert points.check(0.45) == 0.45
    with pytest.raises(ValueError, match=r"budget=0.8: this policy was trained for budgets \[0.3, 0.7\]"):
        points.check(0.8)
    with pytest.raises(ValueError, match="eval_budgets=0.2: this policy was trained for budgets 0.5 only"):
        OperatingPoints([0.5]).check(0.2, "eval_budgets")


def test_a_budget_out_of_range_is_told_the_fix_that_fits_the_policy() -> None:
    """A conditioned policy is not told to become one: pick within its range, or widen it."""
    with pytest.raises(ValueError) as conditioned:
        OperatingPoints([0.3, 0.5, 0.7]).check(0.95, "budget")
    assert str(conditioned.value) == (
        "budget=0.95: this policy was trained for budgets [0.3, 0.7] (a budget-conditioned policy); pick a "
        "budget from 0.3 to 0.7, or retrain with a range that holds 0.95 (model.init_args.budget_range: [lowest, highest])"
    )
    with pytest.raises(ValueError) as single:
        OperatingPoints([0.5]).check(0.95, "budget")
    assert str(single.value) == (
        "budget=0.95: this policy was trained for budgets 0.5 only; train a budget-conditioned policy "
        "(model.init_args.budget_range: [lowest, highest]) to serve others"
    )


@st.composite
def capped(draw):
    num_levels = draw(st.integers(2, 4))
    rows, cols = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batch = draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    grids = [(rows * 2**k, cols * 2**k) for k in range(num_levels - 1)]
    rate = draw(st.floats(0.0, 1.0))
    decisions = [torch.rand(batch, h, w, generator=gen) < rate for h, w in grids]
    priority = [torch.randn(batch, h, w, generator=gen).round(decimals=1) for h, w in grids]  # ties too
    coarse = rows * cols
    max_tokens = draw(st.integers(coarse, coarse * 4 ** (num_levels - 1)))
    return decisions, priority, max_tokens


@settings(max_examples=80, deadline=None)
@given(capped())
def test_the_cap_always_holds_and_keeps_a_valid_tree_most_confident_first(case) -> None:
    decisions, priority, max_tokens = case
    _, candidates = leaf_masks(decisions, ())
    taken = [d & c for d, c in zip(decisions, candidates, strict=True)]
    kept = cap_splits(decisions, priority, max_tokens)
    tokens = count_tokens(kept)
    assert int(tokens.max()) <= max_tokens  # never exceeded
    _, kept_candidates = leaf_masks(kept, ())
    for k, cand, was in zip(kept, kept_candidates, taken, strict=True):
        assert not (k & ~was).any()  # only splits the policy took
        assert not (k & ~cand).any()  # parents before children: every kept split is reachable
    # nothing is dropped while the image is under its cap by a whole split (3 tokens)
    dropped_somewhere = torch.stack(
        [(w & ~k).flatten(1).any(1) for w, k in zip(taken, kept, strict=True)]
    ).any(0)
    assert torch.all(~dropped_somewhere | (tokens > max_tokens - 3))
    uncapped = count_tokens(taken)
    assert torch.equal(tokens[uncapped <= max_tokens], uncapped[uncapped <= max_tokens])


def test_the_cap_drops_the_least_confident_split_first() -> None:
    decisions = [torch.ones(1, 1, 2, dtype=torch.bool), torch.ones(1, 2, 4, dtype=torch.bool)]
    priority = [torch.tensor([[[5.0, 1.0]]]), torch.tensor([[[4.0, 3.0, 9.0, 9.0], [2.0, 0.5, 9.0, 9.0]]])]
    # 2 coarse tokens, each split adds 3. Effective priorities: parent A 5, its children 4 3 2 0.5;
    # parent B 1, its children 9 capped by B to 1 (ties go to the coarser level: B first).
    kept = cap_splits(decisions, priority, 11)  # 3 splits: A, then A's two best children
    assert kept[0].tolist() == [[[True, False]]]
    assert kept[1].tolist() == [[[True, True, False, False], [False, False, False, False]]]
    kept = cap_splits(decisions, priority, 17)  # 5 splits: A, 4, 3, 2, then B (before its children)
    assert kept[0].tolist() == [[[True, True]]]
    assert kept[1].tolist() == [[[True, True, False, False], [True, False, False, False]]]
    with pytest.raises(ValueError, match="max_tokens=1 is below the 2 tokens of the all-coarse layout"):
        cap_splits(decisions, priority, 1)


def test_threshold_mode_meets_the_calibrated_budget(tiny_vit) -> None:
    tok = SplitTokenizer(
        tiny_vit.embed_dim, (64, 32, 16), decision_dim=32, decision_heads=2, budget_points=[0.5]
    ).eval()
    torch.nn.init.normal_(tok.decision.mlp.fc2.weight, std=1.0)
    x = torch.randn(32, 3, 64, 64)
    with torch.no_grad():
        tokens, _ = tok.embed(x, tiny_vit)
        tok.operating_points.update(0, calibrate_threshold(tok.decision_logits(tokens), 0.5))
        layout = tok(x, tiny_vit)
        at_half = tok(x, tiny_vit, threshold=0.5)
    assert float(layout.fraction.mean()) == pytest.approx(0.5, abs=0.03)
    assert not torch.equal(layout.fraction, at_half.fraction)  # the cut, not p > 0.5, decides
    with torch.no_grad():
        capped = tok(x, tiny_vit, max_tokens=8)
    assert max(capped.seqlens) <= 8
    with pytest.raises(ValueError, match="max_tokens with mode='sample'"):  # capped samples: off-policy
        tok(x, tiny_vit, mode="sample", max_tokens=8)


def test_a_budget_conditioned_policy_reads_the_budget(tiny_vit) -> None:
    tok = SplitTokenizer(
        tiny_vit.embed_dim, (64, 32, 16), decision_dim=32, decision_heads=2, budget_points=[0.3, 0.5, 0.7]
    )
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        tokens, _ = tok.embed(x, tiny_vit)
        low, high = tok.decision_logits(tokens, 0.3), tok.decision_logits(tokens, 0.7)
        assert all(torch.equal(a, b) for a, b in zip(low, high, strict=True))  # zero-initialised FiLM
        torch.nn.init.normal_(tok.decision.budget_film[-1].weight)
        low, high = tok.decision_logits(tokens, 0.3), tok.decision_logits(tokens, 0.7)
        assert not torch.equal(low[1], high[1])
        per_image = tok.decision_logits(tokens, torch.tensor([0.3, 0.7, 0.3, 0.7]))
        assert torch.allclose(per_image[1][0], low[1][0]) and torch.allclose(per_image[1][1], high[1][1])
    with pytest.raises(ValueError, match=r"this policy serves budgets \[0.3, 0.7\]: pass the budget to use"):
        tok(x, tiny_vit)
    with pytest.raises(ValueError, match=r"budget_points=1.5 is outside the range"):
        SplitTokenizer(tiny_vit.embed_dim, (64, 32, 16), budget_points=[0.5, 1.5])


def capped_mean(logits: list[torch.Tensor], cut: float, max_tokens: int) -> float:
    """Mean token fraction of ``logits`` split where they pass ``cut``, each image capped."""
    decisions = cap_splits([lg > cut for lg in logits], logits, max_tokens)
    return float(count_tokens(decisions).float().mean()) / 64


def test_the_spread_meets_the_budget_under_any_cap() -> None:
    """Calibrated without a cap, a budget of 0.5 capped at 0.5 falls short; the spread's cut meets it
    (up to the cap's whole splits), a cap that does not bind keeps the exact cut, and one that makes
    the budget unreachable splits all it allows."""
    from splitlab.tokenizer import cap_fraction

    g = torch.Generator().manual_seed(0)
    # 2x2 coarse, 4x4 middle, 8x8 finest; each image with its own offset, so fractions spread out
    offset = torch.randn(400, 1, 1, generator=g) * 1.5
    logits = [torch.randn(400, 2, 2, generator=g) + offset, torch.randn(400, 4, 4, generator=g) + offset]
    points = OperatingPoints([0.3, 0.5, 0.7])
    for p, budget in enumerate([0.3, 0.5, 0.7]):
        points.set(p, calibrate_threshold(logits, budget))
        points.record_spread(p, logits)
    half = torch.tensor([0.5])
    exact = float(points.cut(half))
    assert capped_mean(logits, exact, 64) == pytest.approx(0.5, abs=0.01)
    assert capped_mean(logits, exact, 40) < 0.47  # the cap removes tokens the uncapped cut counted on
    for cap_tokens in (32, 40, 48):  # at the budget, budget + 0.125, + 0.25
        cap = cap_fraction(cap_tokens, 4, 64)
        cut = float(points.cut(half, max_fraction=cap))
        assert cut < exact
        assert capped_mean(logits, cut, cap_tokens) == pytest.approx(min(0.5, cap), abs=0.015), cap_tokens
    assert float(points.cut(half, max_fraction=1.0)) == exact  # a cap that never binds: the exact cut
    # a cap below the budget's reach (28 of 64 tokens): every image split as far as the cap allows
    low = float(points.cut(half, max_fraction=cap_fraction(28, 4, 64)))
    assert capped_mean(logits, low, 28) == pytest.approx(cap_fraction(28, 4, 64))
    # between points the capped cuts interpolate as the exact ones do
    cuts = points.cut(torch.tensor([0.3, 0.4, 0.5]), max_fraction=cap_fraction(40, 4, 64))
    assert float(cuts[1]) == pytest.approx(0.5 * float(cuts[0] + cuts[2]))


def test_the_cap_fraction_counts_whole_splits() -> None:
    from splitlab.tokenizer import cap_fraction

    # 4 coarse tokens, 32 allowed: (32 - 4) // 3 = 9 splits, 4 + 27 = 31 tokens of 64
    assert cap_fraction(32, 4, 64) == 31 / 64
    assert cap_fraction(31, 4, 64) == 31 / 64 and cap_fraction(34, 4, 64) == 34 / 64


def test_points_without_a_spread_keep_their_exact_cut_under_a_cap() -> None:
    points = OperatingPoints([0.3, 0.7])
    points.set(0, 1.5)
    fresh = OperatingPoints([0.3, 0.7])
    fresh.load_state_dict(points.state_dict())  # strict: every buffer is saved
    assert float(fresh.cuts[0]) == 1.5 and int(fresh.spread_counts.sum()) == 0
    assert float(fresh.cut(torch.tensor([0.3]), max_fraction=0.4)) == 1.5  # no spread: the exact cut stands


def test_budgets_between_the_points_are_met_where_the_logits_move_unevenly() -> None:
    """A conditioned policy's logits need not move evenly between its training points: here they
    jump between 0.45 and 0.475 (0.46). Cuts interpolated linearly miss the budgets between; the cuts
    calibrated at three budgets between each two points meet them."""
    from splitlab.tokenizer import fraction_of

    g = torch.Generator().manual_seed(0)
    base = [torch.randn(400, 2, 2, generator=g), torch.randn(400, 4, 4, generator=g)]

    def logits_at(budget: float) -> list[torch.Tensor]:  # a policy whose logits shift unevenly with b
        shift = 2.0 * (budget >= 0.46) + budget
        return [level + shift for level in base]

    points = OperatingPoints([0.3, 0.4, 0.5])
    linear = OperatingPoints([0.3, 0.4, 0.5])
    budgets = points.calibration_budgets()
    assert budgets[:3] == pytest.approx([0.3, 0.4, 0.5]) and len(budgets) == 3 + 2 * 3
    points.fit_sample([logits_at(b) for b in budgets])
    for p, b in enumerate([0.3, 0.4, 0.5]):
        linear.fit(p, logits_at(b))
    for budget in (0.35, 0.44, 0.49):  # between calibrated budgets on either side of the jump
        at = torch.tensor([budget])
        met = fraction_of([lg > points.cut(at) for lg in logits_at(budget)]).mean()
        assert float(met) == pytest.approx(budget, abs=0.02), budget
    missed = fraction_of([lg > linear.cut(torch.tensor([0.45])) for lg in logits_at(0.45)]).mean()
    assert abs(float(missed) - 0.45) > 0.05  # the linear interpolation of the points' cuts
