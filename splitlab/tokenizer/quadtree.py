"""The quadtree walk: split decisions per level -> which patches become tokens -> `TokenLayout`.

Decisions are taken densely, for every patch of every non-finest level at once, and then masked by
reachability (a patch is a candidate only if its parent split). That is distributionally the same
as walking level by level, but needs no data-dependent shapes until the final packing, so the whole
walk costs a handful of tensor ops and one host sync per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from splitlab.tokenizer.layout import TokenLayout
from splitlab.tokenizer.levels import Levels


def upsample2(mask: Tensor, shape: Sequence[int] | None = None) -> Tensor:
    """Hand each cell's value to its four children: ``(..., h, w)`` -> ``(..., 2h, 2w)``, cut to
    ``shape`` (the child level's grid) where the parents' last row or column is clipped."""
    up = mask.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)
    return up if shape is None else up[..., : int(shape[-2]), : int(shape[-1])]


def finest_of(decisions: Sequence[Tensor], finest: Sequence[int] | None) -> tuple[int, int]:
    """The finest grid ``(Hf, Wf)``: the last two of ``finest`` when given, else twice the last decision
    level's grid (a grid the coarsest level divides; a clipped one must be given)."""
    if finest is not None and len(finest) >= 2:
        return int(finest[-2]), int(finest[-1])
    if not decisions:
        raise ValueError("one level and no finest grid: nothing says how many tokens there are")
    return 2 * int(decisions[-1].shape[-2]), 2 * int(decisions[-1].shape[-1])


def child_shapes(decisions: Sequence[Tensor], finest: Sequence[int] | None) -> list[tuple[int, int]]:
    """The grid of the level under each decision level: the next decision level's, the finest last."""
    return [tuple(d.shape[-2:]) for d in decisions[1:]] + [finest_of(decisions, finest)]


def children_count(shape: Sequence[int], child: Sequence[int], device: torch.device | None = None) -> Tensor:
    """``(h, w)``: how many children each patch of a ``shape`` grid has on the ``child`` grid (4, or 2
    and 1 along a clipped last row or column)."""
    rows = torch.full((int(shape[0]),), 2, dtype=torch.long, device=device)
    cols = torch.full((int(shape[1]),), 2, dtype=torch.long, device=device)
    rows[-1] = int(child[0]) - 2 * (int(shape[0]) - 1)
    cols[-1] = int(child[1]) - 2 * (int(shape[1]) - 1)
    return rows[:, None] * cols[None, :]


def leaf_masks(
    decisions: Sequence[Tensor], finest_shape: Sequence[int] | None = None
) -> tuple[list[Tensor], list[Tensor]]:
    """Which patches are tokens (``keep``) and which were asked (``candidates``), per level.

    Args:
        decisions: for each non-finest level, bool ``(..., h_k, w_k)`` split decisions; values at
            patches that are not candidates are ignored.
        finest_shape: ``(..., Hf, Wf)``, the finest grid (see `finest_of`; needed with one level).

    Returns:
        ``keep`` for every level and ``candidates`` for every non-finest level.
    """
    if not decisions:
        return [torch.ones(tuple(finest_shape or ()), dtype=torch.bool)], []
    active = torch.ones_like(decisions[0], dtype=torch.bool)
    keep, candidates = [], []
    for split, child in zip(decisions, child_shapes(decisions, finest_shape), strict=True):
        split = split.bool()
        candidates.append(active)
        keep.append(active & ~split)
        active = upsample2(active & split, child)
    keep.append(active)
    return keep, candidates


def count_tokens(decisions: Sequence[Tensor], finest: Sequence[int] | None = None) -> Tensor:
    """Tokens per image implied by ``decisions`` (any leading batch dims) on the ``finest`` grid."""
    keep, _ = leaf_masks(decisions, finest)
    return sum(k.flatten(-2).sum(-1) for k in keep)


def fraction_of(decisions: Sequence[Tensor], finest: Sequence[int] | None = None) -> Tensor:
    """Token fraction per image implied by ``decisions`` (at least one non-finest level), of the
    ``finest`` grid (`finest_of`)."""
    rows, cols = finest_of(decisions, finest)
    return count_tokens(decisions, (rows, cols)).float() / (rows * cols)


FRACTIONS_AT_ONCE = 16  # cuts evaluated together: all 257 at once took 6 GB on 512 COCO images


def fractions_at(scores: Sequence[Tensor], cuts: Tensor, finest: Sequence[int] | None = None) -> Tensor:
    """``(len(cuts), N)``: each image's token fraction when splitting where its per-level scores pass
    each cut (a few cuts at a time: each is a ``(N, h, w)`` mask per level)."""
    return torch.cat(
        [
            fraction_of([s.float()[None] > t.view(-1, 1, 1, 1) for s in scores], finest)
            for t in cuts.split(FRACTIONS_AT_ONCE)
        ]
    )


def cap_splits(
    decisions: Sequence[Tensor],
    priority: Sequence[Tensor],
    max_tokens: int,
    finest: Sequence[int] | None = None,
) -> list[Tensor]:
    """Keep at most as many splits per image as ``max_tokens`` allows, the most confident first.

    A split turns one token into its children (four, fewer for a clipped edge patch). Each split's
    rank is its priority capped by its ancestors' (a child never outranks its parent), ties going to
    the coarser level, so the kept set is always a valid quadtree: parents before children, in order
    of the policy's confidence, while the tokens they add fit. Vectorised over the batch, no host sync.

    Args:
        decisions: per non-finest level ``(B, h, w)`` bool split decisions.
        priority: per level ``(B, h, w)`` confidence of each split (the split logit).
        max_tokens: the cap on tokens per image.
        finest: the finest grid ``(Hf, Wf)`` (`finest_of`).

    Returns:
        the capped decisions (a subset of ``decisions``).
    """
    if not decisions:
        return []
    coarse = decisions[0].shape[-2] * decisions[0].shape[-1]
    room = max_tokens - coarse
    if room < 0:
        raise ValueError(f"max_tokens={max_tokens} is below the {coarse} tokens of the all-coarse layout")
    children = child_shapes(decisions, finest)
    _, candidates = leaf_masks(decisions, children[-1])
    flat, added, ceiling = [], [], None
    for split, cand, prio, child in zip(decisions, candidates, priority, children, strict=True):
        prio = prio.float()
        if ceiling is not None:
            prio = torch.minimum(prio, upsample2(ceiling, prio.shape[-2:]))
        ceiling = prio
        flat.append(torch.where(split & cand, prio, float("-inf")).flatten(1))
        extra = children_count(split.shape[-2:], child, split.device) - 1
        added.append(extra.reshape(1, -1).expand(split.shape[0], -1))
    scores = torch.cat(flat, 1)
    order = scores.argsort(dim=1, descending=True, stable=True)  # ties: coarser level first
    spent = torch.cat(added, 1).gather(1, order).cumsum(1)  # tokens added by each split and those before it
    fits = (spent <= room) & torch.isfinite(scores.gather(1, order))
    keep = torch.empty_like(fits).scatter_(1, order, fits)
    sizes = [d[0].numel() for d in decisions]
    return [k.view_as(d) for k, d in zip(keep.split(sizes, 1), decisions, strict=True)]


def cap_fraction(max_tokens: int, coarse: int, finest: int) -> float:
    """The most token fraction `cap_splits` leaves an image: a split adds three tokens, so a cap
    of ``max_tokens`` keeps ``coarse + 3 * ((max_tokens - coarse) // 3)`` of ``finest`` (a clipped
    edge patch adds fewer, so on a clipped grid an image can come up to two tokens closer to the cap)."""
    return (coarse + 3 * ((int(max_tokens) - coarse) // 3)) / finest


def cover_slots(keep: Sequence[Tensor], slots: Tensor, levels: Levels) -> Tensor:
    """``(B, Hf, Wf)``: for each finest cell, the slot of the token covering it (exactly one level
    keeps each cell). ``slots`` ``(B, M)`` gives every patch's slot, level after level; a fixed-shape
    computation, shared by the packed walk and the padded one of export."""
    cover, offset = None, 0
    rows, cols = keep[-1].shape[-2:]
    for k, kept in enumerate(keep):
        h, w = kept.shape[-2:]
        side = levels.cells(k)
        here = slots[:, offset : offset + h * w].reshape(-1, h, w)
        offset += h * w
        # a clipped level reaches past the finest grid: cut to the grid
        up = here.repeat_interleave(side, 1).repeat_interleave(side, 2)[:, :rows, :cols]
        kept_up = kept.repeat_interleave(side, 1).repeat_interleave(side, 2)[:, :rows, :cols]
        cover = up if cover is None else torch.where(kept_up, up, cover)
    return cover


@lru_cache(maxsize=64)
def _token_table(
    levels: Levels, grids: tuple[tuple[int, int], ...], device: torch.device
) -> tuple[Tensor, Tensor]:
    """Level and finest-grid box of every patch of every level, flattened level after level (a clipped
    edge patch's box ends at the grid's edge)."""
    level_ids, boxes = [], []
    rows, cols = grids[-1]
    for k, (h, w) in enumerate(grids):
        side = levels.cells(k)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        x0, y0 = xs.reshape(-1) * side, ys.reshape(-1) * side
        x1, y1 = (x0 + side).clamp(max=cols), (y0 + side).clamp(max=rows)
        boxes.append(torch.stack([x0, y0, x1, y1], dim=1))
        level_ids.append(torch.full((h * w,), k, dtype=torch.long))
    return torch.cat(level_ids).to(device), torch.cat(boxes).to(device)


def build_layout(
    level_tokens: Sequence[Tensor],
    decisions: Sequence[Tensor],
    levels: Levels,
    logits: Sequence[Tensor] | None = None,
) -> TokenLayout:
    """Pack the tokens the decisions leave standing into a `TokenLayout`.

    Args:
        level_tokens: per level ``(B, h_k, w_k, D)`` token embeddings, coarse to fine.
        decisions: per non-finest level ``(B, h_k, w_k)`` bool split decisions.
        levels: the quadtree's patch sizes.
        logits: per non-finest level split logits, kept on the layout when given.
    """
    if len(level_tokens) != levels.num or len(decisions) != levels.num - 1:
        raise ValueError(
            f"expected {levels.num} token levels and {levels.num - 1} decision levels, "
            f"got {len(level_tokens)} and {len(decisions)}"
        )
    batch, dim = level_tokens[0].shape[0], level_tokens[0].shape[-1]
    device = level_tokens[0].device
    grids = tuple((int(t.shape[1]), int(t.shape[2])) for t in level_tokens)
    finest_cells = grids[-1][0] * grids[-1][1]
    decisions = [d.to(device=device, dtype=torch.bool) for d in decisions]
    keep, candidates = leaf_masks(decisions, (batch, *grids[-1]))
    keep = [k.to(device) for k in keep]

    keep_flat = torch.cat([k.reshape(batch, -1) for k in keep], dim=1)  # (B, M)
    per_image = keep_flat.shape[1]
    lengths = keep_flat.sum(1)
    seqlens = lengths.tolist()  # the one host sync: shapes downstream depend on it
    total = sum(seqlens)

    # Destination slot of every kept patch in the packed sequence, then its inverse (slot -> patch).
    keep_all = keep_flat.reshape(-1)
    dest = torch.where(keep_all, keep_all.long().cumsum(0) - 1, total)
    source = torch.zeros(total + 1, dtype=torch.long, device=device)
    source.scatter_(0, dest, torch.arange(keep_all.numel(), device=device))
    source = source[:total]

    all_tokens = torch.cat([t.reshape(batch, -1, dim) for t in level_tokens], dim=1).reshape(-1, dim)
    tokens = all_tokens.index_select(0, source)
    level_table, box_table = _token_table(levels, grids, device)
    patch = source % per_image
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)

    cover = cover_slots(keep, dest.view(batch, per_image), levels)

    return TokenLayout(
        tokens=tokens,
        cu_seqlens=cu_seqlens,
        seqlens=seqlens,
        levels=levels,
        level=level_table.index_select(0, patch),
        boxes=box_table.index_select(0, patch),
        image_index=source // per_image,
        cover_index=cover,
        fraction=lengths.float() / finest_cells,
        decisions=[d & c for d, c in zip(decisions, candidates, strict=True)],
        candidates=candidates,
        logits=list(logits) if logits is not None else None,
    )
