"""Warm-start split labels (what the decision module imitates first): from parent-child embedding
differences (the paper's), or from the annotations where the data has them (boxes, masks), which also
give the ``oracle`` layout every comparison shows as its upper bound."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from splitlab.tokenizer.baselines import calibrate_threshold
from splitlab.tokenizer.embed import child_mask, space_to_depth
from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.quadtree import upsample2


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
        distance = (children - parent.float()[..., None, :]).norm(dim=-1)
        exists = child_mask(child.shape[1:3], child.device)  # a clipped parent's children that exist
        distance = distance.mean(-1) if exists is None else (distance * exists).sum(-1) / exists.sum(-1)
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
    threshold = calibrate_threshold(scores, levels.check_fraction(target), finest=content[-1].shape[1:3])
    return [s > threshold for s in scores], threshold


class LabelEmbedding(nn.Module):
    """A frozen copy of the backbone's patch embedding as the warm start began: the fixed target the
    labels are read from. The warm start fine-tunes the backbone's own patch embedding, and labels
    read from it drift with it (perturbing it changed 8 of 16 coarse labels on one batch).

    The copy is taken by `take` at the warm start's first step (after an ``init_checkpoint`` or a
    dense stage has set the weights), kept in the task's checkpoint and never trained.
    """

    def __init__(self, patch_embed: nn.Module) -> None:
        super().__init__()
        self.patch_embed = copy.deepcopy(patch_embed).requires_grad_(False)
        self.register_buffer("taken", torch.tensor(False))
        self.ready = False  # `taken` as a Python bool: checked every step without a device sync

    @torch.no_grad()
    def take(self, patch_embed: nn.Module) -> None:
        """Copy ``patch_embed``'s weights now; they stay fixed from here on."""
        self.patch_embed.load_state_dict(patch_embed.state_dict())
        self.taken.fill_(True)
        self.ready = True

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.ready = bool(self.taken)

    @torch.no_grad()
    def embed_patches(self, images: Tensor) -> Tensor:
        """``(B, C, h*p, w*p)`` -> ``(B, h, w, D)``, as the backbone's ``embed_patches`` did at `take`."""
        x = self.patch_embed.proj(images).permute(0, 2, 3, 1)
        return self.patch_embed.norm(x)


def annotation_scores(cells: Tensor, levels: Levels) -> list[Tensor]:
    """Where the annotations say a patch must split, per non-finest level ``(B, h_k, w_k)``.

    ``cells`` ``(B, Hf, Wf)`` marks the finest-grid cells that should get finest tokens (an object's
    box or mask, a class boundary). A patch holding any marked cell scores 1 plus the share of its
    cells that are marked (the fuller first when the budget cannot buy them all), one holding none
    scores 0; a child never scores above its parent, so one cut splits a valid quadtree top-down.
    """
    marked = cells.float()[:, None]
    scores, ceiling = [], None
    for k in range(levels.num - 1):
        side = levels.cells(k)
        share = F.avg_pool2d(marked, side, ceil_mode=True)[:, 0]  # a clipped patch: of the cells it has
        score = torch.where(share > 0, 1.0 + share, torch.zeros_like(share))
        if ceiling is not None:
            score = torch.minimum(score, upsample2(ceiling, score.shape[-2:]))
        scores.append(score)
        ceiling = score
    return scores


@torch.no_grad()
def annotation_labels(
    cells: Tensor, levels: Levels, target: float, generator: torch.Generator | None = None
) -> tuple[list[Tensor], list[Tensor]]:
    """The oracle's split decisions at ``target`` on this batch: marked patches first (`annotation_scores`),
    ties (the unmarked background, patches as full as each other) broken at random, cut where the
    batch's mean token fraction meets ``target``. What the ``oracle`` evaluation row deploys and
    what ``label_source: annotations`` warm-starts the decision module on.

    Returns:
        per non-finest level ``(B, h_k, w_k)`` bool decisions, and the scores they were cut from.
    """
    scores = annotation_scores(cells, levels)
    noisy = [
        s + 1e-3 * torch.rand(s.shape, generator=generator, device=s.device, dtype=s.dtype) for s in scores
    ]
    return cut_labels(noisy, levels, target, cells.shape[-2:]), noisy


def cut_labels(
    scores: Sequence[Tensor], levels: Levels, target: float, finest: Sequence[int]
) -> list[Tensor]:
    """Split where a tree-consistent score (a child never above its parent) passes the one cut whose
    layouts meet ``target`` on this batch: a valid quadtree, the highest scores split first."""
    cut = calibrate_threshold(scores, levels.check_fraction(target), finest=finest)
    return [s > cut for s in scores]


def tree_scores(gains: Sequence[Tensor]) -> list[Tensor]:
    """Per non-finest level ``(B, h_k, w_k)``: each patch's gain, raised to the best gain of any patch
    under it, so that a child never scores above its parent and one cut splits a valid quadtree
    top-down. A parent whose own split buys little is still split where a descendant's split is
    worth it (the annotation labels' rule: a patch holding any marked cell is split)."""
    scores = [g.float() for g in gains]
    for k in range(len(scores) - 2, -1, -1):
        below = F.max_pool2d(scores[k + 1][:, None], 2, ceil_mode=True)[:, 0]  # a clipped grid: its parents
        scores[k] = torch.maximum(scores[k], below[..., : scores[k].shape[-2], : scores[k].shape[-1]])
    return scores


@torch.no_grad()
def gain_labels(
    gains: Sequence[Tensor], levels: Levels, target: float, finest: Sequence[int]
) -> list[Tensor]:
    """Split labels at ``target`` from each split's estimated gain (how much it lowers the task loss,
    `splitlab.training.refinement_gains`): the largest gains first, through `tree_scores`."""
    return cut_labels(tree_scores(gains), levels, target, finest)
