"""Warm-start labels: from parent-child embedding differences, and from annotations (the oracle)."""

from __future__ import annotations

import pytest
import torch

from splitlab.tokenizer import (
    Levels,
    annotation_labels,
    annotation_scores,
    embedding_difference_scores,
    fraction_of,
    leaf_masks,
    warm_start_labels,
)


def test_embedding_difference_scores_and_labels() -> None:
    d = 8
    fine = torch.zeros(2, 4, 4, d)
    fine[0, :2, :2] = torch.randn(2, 2, d)  # detail in the top-left level-1 patch of image 0
    mid = torch.ones(2, 2, 2, d)
    coarse = torch.ones(2, 1, 1, d)
    scores = embedding_difference_scores([coarse, mid, fine])
    assert scores[1][0, 0, 0] > scores[1][0, 1, 1] and scores[1][0, 0, 0] > scores[1][1, 0, 0]
    content = [torch.randn(16, 1, 1, d), torch.randn(16, 2, 2, d), torch.randn(16, 4, 4, d)]
    for target in (0.25, 0.5, 0.75):
        labels, _ = warm_start_labels(content, Levels((4, 2, 1)), target=target)
        assert fraction_of(labels).mean().item() == pytest.approx(target, abs=0.03)


def test_labels_read_the_raw_embeddings_not_the_trainable_children_projection(
    tiny_vit, tiny_tokenizer
) -> None:
    x = torch.randn(8, 3, 64, 64)
    with torch.no_grad():
        tokens, raw = tiny_tokenizer.embed(x, tiny_vit)
        before, _ = warm_start_labels(raw, tiny_tokenizer.levels, 0.5)
        for proj in tiny_tokenizer.embed.child_proj:  # what the warm start trains
            torch.nn.init.normal_(proj.weight, std=1.0)
        moved, raw_after = tiny_tokenizer.embed(x, tiny_vit)
        after, _ = warm_start_labels(raw_after, tiny_tokenizer.levels, 0.5)
    assert not torch.allclose(moved[0], tokens[0])  # the coarse tokens changed...
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # ...the labels' target did not


def test_annotation_scores_rank_marked_patches_first_and_never_a_child_above_its_parent() -> None:
    levels = Levels((32, 16, 8))  # 4x4 cells per coarse patch, 2x2 per middle one
    cells = torch.zeros(1, 8, 8, dtype=torch.bool)
    cells[0, 0:2, 0:2] = True  # fills the top-left middle patch (a quarter of the coarse patch)
    cells[0, 3, 3] = True  # one cell of the coarse patch's bottom-right middle patch
    coarse, middle = annotation_scores(cells, levels)
    # worked by hand: the coarse patch holds 5 of its 16 cells; the others hold none
    assert coarse[0, 0, 0] == pytest.approx(1 + 5 / 16) and coarse[0, 1, 1] == 0
    # middle patches: 4/4 and 1/4 marked, but capped by their parent's 1 + 5/16
    assert middle[0, 0, 0] == pytest.approx(1 + 5 / 16) and middle[0, 1, 1] == pytest.approx(1.25)
    assert middle[0, 0, 1] == 0 and middle[0, 2, 2] == 0


@pytest.mark.parametrize("target", [0.2, 0.5, 0.8])
def test_annotation_labels_meet_the_budget_and_put_every_marked_cell_at_the_finest_level(target) -> None:
    levels = Levels((32, 16, 8))
    generator = torch.Generator().manual_seed(0)
    cells = torch.rand(16, 16, 16, generator=generator) < 0.02  # a few scattered marked cells
    labels, _ = annotation_labels(cells, levels, target, torch.Generator().manual_seed(1))
    assert fraction_of(labels).mean().item() == pytest.approx(target, abs=0.03)
    keep, _ = leaf_masks(labels, ())
    finest = keep[-1]
    if target >= 0.5:  # the budget buys every marked cell: all of them get finest tokens
        assert finest[cells].all()
    else:  # it cannot: those it buys are marked ones (fuller patches first), not the background
        share_marked = finest[cells].float().mean()
        share_background = finest[~cells].float().mean()
        assert share_marked > 3 * share_background
