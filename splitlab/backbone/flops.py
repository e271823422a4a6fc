"""Backbone FLOPs of uniform and packed sequences: what an ideal implementation would save."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def block_flops(tokens: int, dim: int, hidden: int, attn_dim: int | None = None) -> int:
    """FLOPs (2 per multiply-add) of one pre-norm ViT block on one sequence of ``tokens``.

    Linear layers grow with N (qkv ``3·D·A``, projection ``A·D``, MLP ``2·D·H``), attention with N²
    (``Q·Kᵀ`` and ``attn·V``, each ``N²·A``). Norms, softmax and residual adds are ignored: they
    are a few percent and memory-bound.
    """
    attn_dim = dim if attn_dim is None else attn_dim
    linear = tokens * (3 * dim * attn_dim + attn_dim * dim + 2 * dim * hidden)
    attention = 2 * tokens * tokens * attn_dim
    return 2 * (linear + attention)


def vit_block_shapes(model: nn.Module) -> list[tuple[int, int, int]]:
    """``(dim, hidden, attn_dim)`` of each block of a timm ViT, read off its layers."""
    shapes = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        dim = attn.qkv.in_features
        attn_dim = attn.qkv.out_features // 3
        shapes.append((dim, mlp.fc1.out_features, attn_dim))
    return shapes


def backbone_flops(model: nn.Module, seqlens: Sequence[int]) -> int:
    """FLOPs of a timm ViT's blocks over images of ``seqlens`` tokens each (prefix tokens included)."""
    return sum(
        block_flops(n, dim, hidden, attn_dim)
        for dim, hidden, attn_dim in vit_block_shapes(model)
        for n in seqlens
    )
