"""Property tests of the quadtree walk and the packed `TokenLayout`."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitlab.tokenizer import Levels, build_layout, count_tokens, policy


@st.composite
def walks(draw):
    num_levels = draw(st.integers(1, 4))
    levels = Levels(tuple(2 ** (num_levels - 1 - k) for k in range(num_levels)))  # finest = 1 px
    rows, cols = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batch = draw(st.integers(1, 4))
    rate = draw(st.floats(0.0, 1.0))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    grids = [(rows * 2**k, cols * 2**k) for k in range(num_levels)]
    tokens = [torch.randn(batch, h, w, 5, generator=gen) for h, w in grids]
    decisions = [torch.rand(batch, h, w, generator=gen) < rate for h, w in grids[:-1]]
    return levels, tokens, decisions


@settings(max_examples=60, deadline=None)
@given(walks())
def test_tokens_tile_the_image_exactly_once(walk) -> None:
    levels, tokens, decisions = walk
    layout = build_layout(tokens, decisions, levels)
    b, hf, wf = layout.cover_index.shape
    painted = torch.zeros(b, hf, wf, dtype=torch.long)
    for (x0, y0, x1, y1), img in zip(layout.boxes.tolist(), layout.image_index.tolist(), strict=True):
        painted[img, y0:y1, x0:x1] += 1
    assert torch.equal(painted, torch.ones_like(painted))
    # cover_index points at a token of the same image whose box holds the cell
    ys, xs = torch.meshgrid(torch.arange(hf), torch.arange(wf), indexing="ij")
    covering = layout.boxes[layout.cover_index]  # (B, Hf, Wf, 4)
    assert torch.all((covering[..., 0] <= xs) & (xs < covering[..., 2]))
    assert torch.all((covering[..., 1] <= ys) & (ys < covering[..., 3]))
    assert torch.equal(
        layout.image_index[layout.cover_index], torch.arange(b).view(b, 1, 1).expand(b, hf, wf)
    )


@settings(max_examples=60, deadline=None)
@given(walks())
def test_lengths_offsets_and_fractions_agree(walk) -> None:
    levels, tokens, decisions = walk
    layout = build_layout(tokens, decisions, levels)
    b = tokens[0].shape[0]
    assert len(layout.seqlens) == b
    assert layout.cu_seqlens.tolist() == [0, *torch.tensor(layout.seqlens).cumsum(0).tolist()]
    assert layout.tokens.shape[0] == layout.cu_seqlens[-1] == sum(layout.seqlens)
    assert torch.equal(torch.bincount(layout.image_index, minlength=b), torch.tensor(layout.seqlens))
    finest = tokens[-1].shape[1] * tokens[-1].shape[2]
    assert torch.allclose(layout.fraction, torch.tensor(layout.seqlens, dtype=torch.float) / finest)
    if decisions:
        assert count_tokens(decisions).tolist() == layout.seqlens
    # a token's area in cells matches its level; areas sum to the finest grid
    side = layout.boxes[:, 2] - layout.boxes[:, 0]
    assert torch.equal(side, torch.tensor([levels.cells(k) for k in layout.level.tolist()], dtype=side.dtype))
    area = torch.zeros(b, dtype=torch.long).index_add(0, layout.image_index, side * side)
    assert torch.all(area == finest)


@settings(max_examples=40, deadline=None)
@given(walks())
def test_tokens_are_the_kept_embeddings(walk) -> None:
    levels, tokens, decisions = walk
    layout = build_layout(tokens, decisions, levels)
    for t in range(layout.tokens.shape[0]):
        k, img = int(layout.level[t]), int(layout.image_index[t])
        x0, y0 = (layout.boxes[t, :2] // levels.cells(k)).tolist()
        assert torch.equal(layout.tokens[t], tokens[k][img, y0, x0])
    # and within an image: coarse level first, raster order within a level
    for img_tokens_level, img_boxes in zip(
        layout.split(layout.level[:, None]), layout.split(layout.boxes), strict=True
    ):
        key = img_tokens_level[:, 0] * 10**6 + img_boxes[:, 1] * 10**3 + img_boxes[:, 0]
        assert torch.all(key[1:] > key[:-1])


@settings(max_examples=40, deadline=None)
@given(walks())
def test_decisions_only_at_candidates(walk) -> None:
    levels, tokens, decisions = walk
    layout = build_layout(tokens, decisions, levels)
    for k, (taken, cand, given_) in enumerate(
        zip(layout.decisions, layout.candidates, decisions, strict=True)
    ):
        assert torch.equal(taken, given_ & cand)
        if k == 0:
            assert cand.all()
        else:  # a patch is a candidate exactly when its parent split
            parent_split = layout.decisions[k - 1].repeat_interleave(2, 1).repeat_interleave(2, 2)
            assert torch.equal(cand, parent_split)


def test_unpack_and_pool() -> None:
    levels = Levels((4, 2, 1))
    tokens = [torch.randn(2, 1, 1, 3), torch.randn(2, 2, 2, 3), torch.randn(2, 4, 4, 3)]
    decisions = [torch.tensor([[[True]], [[False]]]), torch.tensor([[[True, False], [False, False]]] * 2)]
    layout = build_layout(tokens, decisions, levels)
    assert layout.seqlens == [7, 1]
    grid = layout.unpack_to_grid()
    assert grid.shape == (2, 3, 4, 4)
    assert torch.equal(grid[1], tokens[0][1, 0, 0][:, None, None].expand(3, 4, 4))  # all coarse: constant
    assert torch.equal(grid[0, :, 0, 0], tokens[2][0, 0, 0]) and torch.equal(
        grid[0, :, 1, 1], tokens[2][0, 1, 1]
    )
    assert torch.equal(grid[0, :, 3, 3], tokens[1][0, 1, 1])
    assert torch.allclose(layout.pool(weighting="area"), grid.mean((2, 3)))
    assert torch.allclose(layout.pool()[0], layout.split()[0].mean(0))
    assert torch.equal(layout.level_map()[0, 2:, 2:], torch.ones(2, 2, dtype=torch.long))


@settings(max_examples=40, deadline=None)
@given(walks(), st.data())
def test_selecting_images_gives_the_layout_of_those_images_alone(walk, data) -> None:
    """`TokenLayout.select` (a multi-task batch's images of one task) equals walking those images alone."""
    levels, tokens, decisions = walk
    batch = tokens[0].shape[0]
    chosen = data.draw(st.lists(st.integers(0, batch - 1), min_size=1, max_size=batch, unique=True))
    logits = [torch.randn(d.shape) for d in decisions]
    picked = build_layout(tokens, decisions, levels, logits or None).select(chosen)
    index = torch.tensor(chosen)
    alone = build_layout(
        [t[index] for t in tokens],
        [d[index] for d in decisions],
        levels,
        [lg[index] for lg in logits] or None,
    )
    for name in ("tokens", "cu_seqlens", "level", "boxes", "image_index", "cover_index", "fraction"):
        assert torch.equal(getattr(picked, name), getattr(alone, name)), name
    assert picked.seqlens == alone.seqlens
    for a, b in zip(picked.decisions + picked.candidates, alone.decisions + alone.candidates, strict=True):
        assert torch.equal(a, b)
    if logits:  # the decisions' Bernoulli likelihood and entropy are those of the images alone
        pairs = zip(picked.logits, alone.logits, picked.decisions, alone.decisions, strict=True)
        for a, b, taken_a, taken_b in pairs:
            assert torch.equal(policy.log_prob(a, taken_a), policy.log_prob(b, taken_b))
            assert torch.equal(policy.entropy(a), policy.entropy(b))
