"""Backbone FLOPs of uniform and packed sequences: what an ideal implementation would save."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def block_flops(tokens: int, dim: int, hidden: int, attn_dim: int | None = None) -> int:
    """FLOPs (2 per multiply-add) of one plain pre-norm ViT block on one sequence of ``tokens``.

    Linear layers grow with N (qkv ``3·D·A``, projection ``A·D``, MLP ``2·D·H``), attention with N²
    (``Q·Kᵀ`` and ``attn·V``, each ``N²·A``). Norms, softmax and residual adds are ignored: they
    are a few percent and memory-bound.
    """
    attn_dim = dim if attn_dim is None else attn_dim
    return 2 * (
        tokens * (3 * dim * attn_dim + attn_dim * dim + 2 * dim * hidden) + 2 * tokens * tokens * attn_dim
    )


def block_costs(block: nn.Module) -> tuple[int, int]:
    """Per-token linear MACs (every ``nn.Linear`` in the block: qkv or q/k/v, projection, MLP or
    SwiGLU) and the attention width, read off a timm ViT or EVA block."""
    linear = sum(m.in_features * m.out_features for m in block.modules() if isinstance(m, nn.Linear))
    attn = block.attn
    attn_dim = attn.num_heads * attn.head_dim
    return linear, attn_dim


def backbone_flops(model: nn.Module, seqlens: Sequence[int]) -> int:
    """FLOPs of a timm ViT's blocks over images of ``seqlens`` tokens each (prefix tokens included)."""
    total = 0
    for block in model.blocks:
        linear, attn_dim = block_costs(block)
        total += sum(2 * (n * linear + 2 * n * n * attn_dim) for n in seqlens)
    return total
