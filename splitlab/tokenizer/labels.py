"""Warm-start split labels from parent-child embedding differences (what the decision module imitates first)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from splitlab.tokenizer.baselines import calibrate_threshold
from splitlab.tokenizer.embed import space_to_depth
from splitlab.tokenizer.levels import Levels


@torch.no_grad()
def embedding_difference_scores(content: Sequence[Tensor]) -> list[Tensor]:
    """How much a parent's embedding misses of its children, per non-finest patch.

    The backbone's patch embedding is linear, so on a flat patch the downsampled parent and its
    full-resolution children embed alike and the score is 0; detail the downsampling blurs away
    makes them differ. The mean child distance is divided by the parent's norm so that bright and
    dark regions compare fairly.

    Args:
        content: per level ``(B, h_k, w_k, D)`` patch-content embeddings (no position), coarse to fine.

    Returns:
        per non-finest level ``(B, h_k, w_k)`` scores.
    """
    scores = []
    for parent, child in zip(content[:-1], content[1:], strict=False):
        children = space_to_depth(child.float())  # (B, h, w, 4, D)
        distance = (children - parent.float()[..., None, :]).norm(dim=-1).mean(-1)
        scores.append(distance / (parent.float().norm(dim=-1) + 1e-6))
    return scores


@torch.no_grad()
def warm_start_labels(content: Sequence[Tensor], levels: Levels, target: float) -> tuple[list[Tensor], float]:
    """Split labels whose layouts meet ``target`` on this batch: split where the score passes a
    threshold chosen per batch.

    Returns:
        per non-finest level ``(B, h_k, w_k)`` bool labels, and the threshold used.
    """
    scores = embedding_difference_scores(content)
    threshold = calibrate_threshold(scores, levels.check_fraction(target))
    return [s > threshold for s in scores], threshold
