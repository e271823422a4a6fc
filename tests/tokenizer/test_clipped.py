"""Grids the coarsest level does not divide (27 x 27, 37 x 37, 6 x 7): clipped edge patches cover only
the cells that exist, every count and fraction is of the real grid, and nothing reads past the edge."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from splitlab.backbone import PackedViT
from splitlab.tokenizer import (
    Levels,
    SplitTokenizer,
    annotation_scores,
    build_layout,
    cap_splits,
    embedding_difference_scores,
    entropy_scores,
    expected_random_fraction,
    fraction_of,
)
from splitlab.tokenizer.baselines import random_split_rate

LEVELS = Levels.build((32, 16, 8))  # a coarse patch: 4 x 4 cells


def random_decisions(batch: int, finest: tuple[int, int], rate: float, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.rand(batch, *LEVELS.grid_of(k, finest), generator=gen) < rate for k in range(LEVELS.num - 1)
    ]


def tokens_for(batch: int, finest: tuple[int, int], dim: int = 4) -> list[torch.Tensor]:
    return [torch.randn(batch, *grid, dim) for grid in LEVELS.grids(finest)]


@pytest.mark.parametrize("finest", [(7, 7), (6, 9), (9, 5), (8, 8)])
@pytest.mark.parametrize("rate", [0.0, 0.4, 1.0])
def test_every_cell_lies_under_exactly_one_token(finest, rate) -> None:
    decisions = random_decisions(5, finest, rate, seed=int(rate * 10))
    layout = build_layout(tokens_for(5, finest), decisions, LEVELS)
    rows, cols = finest
    assert layout.grid_size == finest
    area = torch.zeros(5, rows, cols, dtype=torch.long)
    for box, image in zip(layout.boxes.tolist(), layout.image_index.tolist(), strict=True):
        x0, y0, x1, y1 = box
        assert 0 <= x0 < x1 <= cols and 0 <= y0 < y1 <= rows  # no box reaches past the grid
        area[image, y0:y1, x0:x1] += 1
    assert torch.equal(area, torch.ones_like(area))
    # the cover index names, for each cell, the token whose box holds it
    boxes = layout.boxes[layout.cover_index]  # (B, H, W, 4)
    ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    assert bool(
        ((boxes[..., 0] <= xs) & (xs < boxes[..., 2]) & (boxes[..., 1] <= ys) & (ys < boxes[..., 3])).all()
    )
    # the fraction is of the real grid, and fraction_of agrees when told the grid
    counts = torch.tensor(layout.seqlens, dtype=torch.float32)
    assert torch.allclose(layout.fraction, counts / (rows * cols))
    assert torch.allclose(fraction_of(decisions, finest), layout.fraction)


def test_all_coarse_and_all_fine_layouts_of_a_27_grid() -> None:
    finest = (27, 27)
    levels = Levels.build((56, 28, 14))
    tokens = [torch.randn(2, *grid, 3) for grid in levels.grids(finest)]
    coarse = build_layout(
        tokens, [torch.zeros(2, *t.shape[1:3], dtype=torch.bool) for t in tokens[:-1]], levels
    )
    assert (
        coarse.seqlens == [49, 49] and abs(float(coarse.fraction[0]) - levels.min_fraction_on(finest)) < 1e-7
    )
    fine = build_layout(tokens, [torch.ones(2, *t.shape[1:3], dtype=torch.bool) for t in tokens[:-1]], levels)
    assert fine.seqlens == [729, 729] and torch.equal(fine.tokens, tokens[-1].reshape(-1, 3))


@pytest.mark.parametrize("finest", [(7, 7), (6, 9), (5, 5)])
def test_cap_keeps_the_most_confident_splits_that_fit_exactly(finest) -> None:
    """A clipped split adds fewer than three tokens; the cap spends exactly what each split adds, most
    confident first, parents before children (checked against a brute-force walk)."""
    gen = torch.Generator().manual_seed(0)
    decisions = [torch.ones(3, *LEVELS.grid_of(k, finest), dtype=torch.bool) for k in range(LEVELS.num - 1)]
    priority = [torch.randn(3, *d.shape[1:], generator=gen) for d in decisions]
    coarse = decisions[0][0].numel()
    for cap in range(coarse, finest[0] * finest[1] + 1, 3):
        kept = cap_splits(decisions, priority, cap, finest)
        layout = build_layout(tokens_for(3, finest), kept, LEVELS)
        assert max(layout.seqlens) <= cap
        for image in range(3):
            assert layout.seqlens[image] == brute_force_capped(priority, image, cap, finest)


def brute_force_capped(priority: list[torch.Tensor], image: int, cap: int, finest: tuple[int, int]) -> int:
    """Tokens of the greedy walk: repeatedly split the open patch of highest (ancestor-capped) priority
    while the tokens it adds fit, coarse first on ties, then raster order (as a stable sort)."""
    rows, cols = finest

    def children(level: int, y: int, x: int) -> list[tuple[int, int, int]]:
        h, w = LEVELS.grid_of(level + 1, finest)
        return [
            (level + 1, 2 * y + dy, 2 * x + dx)
            for dy, dx in itertools.product((0, 1), (0, 1))
            if 2 * y + dy < h and 2 * x + dx < w
        ]

    grid0 = LEVELS.grid_of(0, finest)
    open_ = {(0, y, x): float(priority[0][image, y, x]) for y in range(grid0[0]) for x in range(grid0[1])}
    tokens = len(open_)
    while True:
        splittable = [(p, -lv, -y, -x) for (lv, y, x), p in open_.items() if lv < LEVELS.num - 1]
        if not splittable:
            return tokens
        best = max(splittable)
        lv, y, x = -best[1], -best[2], -best[3]
        kids = children(lv, y, x)
        if tokens + len(kids) - 1 > cap:
            return tokens
        del open_[(lv, y, x)]
        tokens += len(kids) - 1
        for kid in kids:
            klv, ky, kx = kid
            prio = float(priority[klv][image, ky, kx]) if klv < LEVELS.num - 1 else float("-inf")
            open_[kid] = min(prio, best[0])


@pytest.mark.parametrize("finest", [(7, 7), (6, 9)])
def test_random_rate_meets_the_fraction_in_expectation_on_a_clipped_grid(finest) -> None:
    rate = random_split_rate(0.5, LEVELS, finest)
    assert expected_random_fraction(rate, LEVELS.num, finest) == pytest.approx(0.5, abs=1e-6)
    realised = torch.cat(
        [fraction_of(random_decisions(200, finest, rate, seed), finest) for seed in range(20)]
    )
    assert float(realised.mean()) == pytest.approx(0.5, abs=0.01)


def test_scores_of_a_clipped_patch_read_only_the_cells_it_has() -> None:
    finest = (6, 7)
    cells = torch.zeros(1, *finest, dtype=torch.bool)
    cells[0, 5, 6] = True  # the bottom-right cell: under a coarse patch that has 2 x 3 of its 16 cells
    scores = annotation_scores(cells, LEVELS)
    assert scores[0].shape == (1, 2, 2) and float(scores[0][0, 1, 1]) == pytest.approx(1 + 1 / 6)
    # its child holds 1 of its 2 cells (1.5), capped by the parent's score
    assert scores[1].shape == (1, 3, 4) and float(scores[1][0, 2, 3]) == pytest.approx(1 + 1 / 6)
    cells[0, 0, 0] = True
    assert float(annotation_scores(cells, LEVELS)[1][0, 0, 0]) == pytest.approx(1 + 1 / 16)
    # embedding differences: a clipped parent is compared with the children it has, not with zeros
    content = [torch.ones(1, *g, 5) for g in LEVELS.grids(finest)]
    assert all(float(s.abs().max()) < 1e-6 for s in embedding_difference_scores(content))
    # pixel entropy: a flat image has none, clipped patches included (no zero padding read)
    flat = torch.full((1, 3, 6 * 8 + 5, 7 * 8), 0.5)
    assert all(float(s.abs().max()) == 0 for s in entropy_scores(flat, LEVELS))


@pytest.fixture
def odd_vit() -> PackedViT:
    """A 2-block ViT/8 whose 54 x 62 px images hold 6 x 7 patches (and 6 px past the last column)."""
    return PackedViT("test_vit", img_size=(48, 56), patch_size=8, depth=2).eval()


def test_clipped_positions_are_the_mean_of_their_cells_and_divisible_ones_unchanged(odd_vit) -> None:
    fine = odd_vit.pos_embed_level((6, 7))
    assert fine.shape == (6, 7, odd_vit.embed_dim)
    level = odd_vit.pos_embed_level((6, 7), 4)
    assert level.shape == (2, 2, odd_vit.embed_dim)
    torch.testing.assert_close(level[1, 1], fine[4:6, 4:7].mean((0, 1)))
    torch.testing.assert_close(level[0, 0], fine[0:4, 0:4].mean((0, 1)))
    even = PackedViT("test_vit", img_size=64, patch_size=8, depth=1)
    from timm.layers import resample_abs_pos_embed

    expected = resample_abs_pos_embed(
        even.model.pos_embed[:, 1:], [2, 2], old_size=[8, 8], num_prefix_tokens=0
    )
    torch.testing.assert_close(even.pos_embed_level((8, 8), 4), expected.view(2, 2, -1))


def test_nothing_past_the_grid_is_read(odd_vit) -> None:
    """Pixels past the last whole patch (as SigLIP-so400m/14 leaves 6 of 384) change no token, and the
    uniform layout is the backbone's own patch embedding plus position in raster order."""
    tok = SplitTokenizer(odd_vit.embed_dim, LEVELS, decision_dim=16, decision_heads=2).eval()
    torch.nn.init.normal_(tok.decision.mlp.fc2.weight, std=1.0)
    x = torch.randn(2, 3, 48 + 6, 56 + 6)
    y = x.clone()
    y[..., 48:, :] = 5.0
    y[..., :, 56:] = -5.0
    with torch.no_grad():
        a, b = tok.embed(x, odd_vit)[0], tok.embed(y, odd_vit)[0]
        for ta, tb in zip(a, b, strict=True):
            torch.testing.assert_close(ta, tb)
        uniform = tok(
            x, odd_vit, mode="scores", scores=[torch.ones(2, *t.shape[1:3]) for t in a[:-1]], threshold=0.0
        )
        own = (
            odd_vit.model.patch_embed.proj(x[..., :48, :56]).flatten(2).transpose(1, 2)
            + odd_vit.model.pos_embed[:, 1:]
        )
    torch.testing.assert_close(uniform.tokens.view(2, 42, -1), own)


def test_clipped_decisions_attend_to_the_children_that_exist_only(odd_vit) -> None:
    """A clipped parent's logit is the module's cross-attention over the children it has (an
    independent computation here, by hand), whatever the padding holds."""
    tok = SplitTokenizer(odd_vit.embed_dim, LEVELS, decision_dim=16, decision_heads=2).eval()
    torch.nn.init.normal_(tok.decision.mlp.fc2.weight, std=1.0)
    finest = (6, 7)
    tokens = [torch.randn(2, *g, odd_vit.embed_dim) for g in LEVELS.grids(finest)]
    dec = tok.decision
    with torch.no_grad():
        got = tok.decision_logits(tokens)
        queries, keys_values = dec.project(tokens)
        for level in range(LEVELS.num - 1):
            child_grid = tokens[level + 1].shape[1:3]
            for y, x in [(0, 0), (tokens[level].shape[1] - 1, tokens[level].shape[2] - 1)]:
                places = [(dy, dx) for dy, dx in itertools.product((0, 1), (0, 1))]
                there = [
                    (q, 2 * y + dy, 2 * x + dx)
                    for q, (dy, dx) in enumerate(places)
                    if 2 * y + dy < child_grid[0] and 2 * x + dx < child_grid[1]
                ]
                query = queries[level][:, y, x]  # (B, dim)
                kv = torch.stack([keys_values[level][:, cy, cx] for _, cy, cx in there], 1)  # (B, n, 2 dim)
                k, v = kv.chunk(2, -1)
                k = k + dec.quadrant[[q for q, _, _ in there]]
                heads = dec.num_heads
                qh = query.view(2, heads, -1)
                kh, vh = k.view(2, len(there), heads, -1), v.view(2, len(there), heads, -1)
                attn = torch.einsum("bhd,bchd->bhc", qh, kh) * dec.head_dim**-0.5
                summary = torch.einsum("bhc,bchd->bhd", attn.softmax(-1), vh).reshape(2, -1)
                expected = dec.mlp(torch.cat([query, summary], -1)).squeeze(-1)
                torch.testing.assert_close(got[level][:, y, x], expected, rtol=1e-5, atol=1e-5)


def test_budget_is_met_on_a_clipped_grid_through_the_model() -> None:
    """The learned policy's calibrated cut meets the budget of the real grid (a 27 x 27 grid)."""
    from splitlab.model import SplitModel

    model = SplitModel.from_config(
        {
            "task": "classification",
            "backbone": "test_vit",
            "levels": [32, 16, 8],
            "budget": 0.5,
            "backbone_kwargs": {"img_size": 216, "patch_size": 8, "depth": 1, "num_classes": 3},
        }
    ).eval()
    torch.nn.init.normal_(model.tokenizer.decision.mlp.fc2.weight, std=1.0)
    from splitlab.model.calibrate import fit_cuts

    x = torch.randn(16, 3, 216, 216)
    fit_cuts(model, [x], 0.5)
    with torch.no_grad():
        layout = model.layout(x)
    assert layout.grid_size == (27, 27)
    assert float(layout.fraction.mean()) == pytest.approx(0.5, abs=0.03)
    assert F.one_hot(layout.level, 3).sum(0).min() > 0  # every level used
