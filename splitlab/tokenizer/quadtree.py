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
from splitlab.tokenizer.policy import per_image_stats


def upsample2(mask: Tensor) -> Tensor:
    """Hand each cell's value to its four children: ``(..., h, w)`` -> ``(..., 2h, 2w)``."""
    return mask.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)


def leaf_masks(decisions: Sequence[Tensor], finest_shape: Sequence[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Which patches are tokens (``keep``) and which were asked (``candidates``), per level.

    Args:
        decisions: for each non-finest level, bool ``(..., h_k, w_k)`` split decisions; values at
            patches that are not candidates are ignored.
        finest_shape: ``(..., Hf, Wf)`` used when there is a single level.

    Returns:
        ``keep`` for every level and ``candidates`` for every non-finest level.
    """
    if not decisions:
        return [torch.ones(tuple(finest_shape), dtype=torch.bool)], []
    active = torch.ones_like(decisions[0], dtype=torch.bool)
    keep, candidates = [], []
    for split in decisions:
        split = split.bool()
        candidates.append(active)
        keep.append(active & ~split)
        active = upsample2(active & split)
    keep.append(active)
    return keep, candidates


def count_tokens(decisions: Sequence[Tensor]) -> Tensor:
    """Tokens per image implied by ``decisions`` (any leading batch dims)."""
    keep, _ = leaf_masks(decisions, ())
    return sum(k.flatten(-2).sum(-1) for k in keep)


def fraction_of(decisions: Sequence[Tensor]) -> Tensor:
    """Token fraction per image implied by ``decisions`` (at least one non-finest level)."""
    finest = decisions[-1].shape[-2] * 2 * decisions[-1].shape[-1] * 2
    return count_tokens(decisions).float() / finest


FRACTIONS_AT_ONCE = 16  # cuts evaluated together: all 257 at once took 6 GB on 512 COCO images


def fractions_at(scores: Sequence[Tensor], cuts: Tensor) -> Tensor:
    """``(len(cuts), N)``: each image's token fraction when splitting where its per-level scores pass
    each cut (a few cuts at a time: each is a ``(N, h, w)`` mask per level)."""
    return torch.cat(
        [
            fraction_of([s.float()[None] > t.view(-1, 1, 1, 1) for s in scores])
            for t in cuts.split(FRACTIONS_AT_ONCE)
        ]
    )


def cap_splits(decisions: Sequence[Tensor], priority: Sequence[Tensor], max_tokens: int) -> list[Tensor]:
    """Keep at most as many splits per image as ``max_tokens`` allows, the most confident first.

    A split turns one token into four, so an image may keep ``(max_tokens - coarse tokens) // 3``
    splits. Each split's rank is its priority capped by its ancestors' (a child never outranks its
    parent), ties going to the coarser level, so the kept set is always a valid quadtree: parents
    before children, in order of the policy's confidence. Vectorised over the batch, no host sync.

    Args:
        decisions: per non-finest level ``(B, h, w)`` bool split decisions.
        priority: per level ``(B, h, w)`` confidence of each split (the split logit).
        max_tokens: the cap on tokens per image.

    Returns:
        the capped decisions (a subset of ``decisions``).
    """
    if not decisions:
        return []
    coarse = decisions[0].shape[-2] * decisions[0].shape[-1]
    allowed = (max_tokens - coarse) // 3
    if allowed < 0:
        raise ValueError(f"max_tokens={max_tokens} is below the {coarse} tokens of the all-coarse layout")
    _, candidates = leaf_masks(decisions, ())
    flat, ceiling = [], None
    for split, cand, prio in zip(decisions, candidates, priority, strict=True):
        prio = prio.float()
        if ceiling is not None:
            prio = torch.minimum(prio, upsample2(ceiling))
        ceiling = prio
        flat.append(torch.where(split & cand, prio, float("-inf")).flatten(1))
    scores = torch.cat(flat, 1)
    order = scores.argsort(dim=1, descending=True, stable=True)  # ties: coarser level first
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
    )
    keep = (rank < allowed) & torch.isfinite(scores)
    sizes = [d[0].numel() for d in decisions]
    return [k.view_as(d) for k, d in zip(keep.split(sizes, 1), decisions, strict=True)]


def cap_fraction(max_tokens: int, coarse: int, finest: int) -> float:
    """The most token fraction `cap_splits` leaves an image: a split adds three tokens, so a cap
    of ``max_tokens`` keeps ``coarse + 3 * ((max_tokens - coarse) // 3)`` of ``finest``."""
    return (coarse + 3 * ((int(max_tokens) - coarse) // 3)) / finest


def cover_slots(keep: Sequence[Tensor], slots: Tensor, levels: Levels) -> Tensor:
    """``(B, Hf, Wf)``: for each finest cell, the slot of the token covering it (exactly one level
    keeps each cell). ``slots`` ``(B, M)`` gives every patch's slot, level after level; a fixed-shape
    computation, shared by the packed walk and the padded one of export."""
    cover, offset = None, 0
    for k, kept in enumerate(keep):
        h, w = kept.shape[-2:]
        side = levels.cells(k)
        here = slots[:, offset : offset + h * w].reshape(-1, h, w)
        offset += h * w
        up = here.repeat_interleave(side, 1).repeat_interleave(side, 2)
        kept_up = kept.repeat_interleave(side, 1).repeat_interleave(side, 2)
        cover = up if cover is None else torch.where(kept_up, up, cover)
    return cover


@lru_cache(maxsize=64)
def _token_table(
    levels: Levels, grids: tuple[tuple[int, int], ...], device: torch.device
) -> tuple[Tensor, Tensor]:
    """Level and finest-grid box of every patch of every level, flattened level after level."""
    level_ids, boxes = [], []
    for k, (h, w) in enumerate(grids):
        side = levels.cells(k)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        x0, y0 = xs.reshape(-1) * side, ys.reshape(-1) * side
        boxes.append(torch.stack([x0, y0, x0 + side, y0 + side], dim=1))
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
        logits: per non-finest level split logits; when given, the layout carries the per-image
            log-probability and entropy of ``decisions``.
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

    log_prob = entropy = None
    if logits is not None:
        log_prob, entropy = per_image_stats(logits, decisions, candidates)
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
        log_prob=log_prob,
        entropy=entropy,
    )
