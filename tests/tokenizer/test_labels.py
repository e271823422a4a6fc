"""Warm-start labels from parent-child embedding differences."""

from __future__ import annotations

import pytest
import torch

from splitlab.tokenizer import Levels, embedding_difference_scores, fraction_of, warm_start_labels


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
