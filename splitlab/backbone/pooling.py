"""timm's classifier heads on per-image sequences of any length: pooling, attention pools, DeiT's
distillation head. The packed path and the padded one of export share these, so both pool as the
timm model's own ``forward_head`` does on the uniform grid."""

from __future__ import annotations

import inspect

import torch
from timm.models.eva import Eva
from torch import Tensor, nn


def includes_prefix(model: nn.Module, attention: bool) -> bool:
    """Whether ``model``'s pooling reads the class and register tokens too: timm's VisionTransformer
    says so in ``pool_include_prefix``; Eva's attention pool reads every token, its reductions the
    patch tokens only."""
    if isinstance(model, Eva):
        return attention
    return bool(getattr(model, "pool_include_prefix", False))


def pool_padded(model: nn.Module, x: Tensor, valid: Tensor, prefix: int) -> Tensor:
    """``model``'s pooling of padded sequences: ``x`` ``(B, P + N, D)`` with ``prefix`` = P class and
    register tokens first, ``valid`` ``(B, P + N)`` bool (False on padding) -> ``(B, D)``."""
    pool = getattr(model, "attn_pool", None)
    kind = model.global_pool
    if pool is None and kind == "token":
        return x[:, 0]
    if not includes_prefix(model, pool is not None):
        x, valid = x[:, prefix:], valid[:, prefix:]
    if pool is not None:
        return attention_pool(pool, x, valid)
    weights = valid.to(x.dtype)[..., None]
    mean = (x * weights).sum(1) / weights.sum(1)
    if kind == "avg":
        return mean
    peak = x.masked_fill(~valid[..., None], float("-inf")).amax(1)
    if kind == "max":
        return peak
    if kind == "avgmax":
        return 0.5 * (peak + mean)
    raise ValueError(
        f"global_pool={kind!r} gives no vector per image (expected token, avg, max, avgmax or map)"
    )


def attention_pool(pool: nn.Module, x: Tensor, valid: Tensor) -> Tensor:
    """A timm attention pool (SigLIP's ``map``, PRR) over each image's own tokens of a padded batch:
    padding masked out where the pool takes a mask, else one image at a time (never across images)."""
    if "attn_mask" in inspect.signature(pool.forward).parameters:
        # bool for SDPA (True attends); the unfused path adds the mask to the scores: 0 or -inf
        if getattr(pool, "fused_attn", False):
            mask = valid[:, None, None, :]
        else:
            mask = torch.zeros(valid.shape, dtype=x.dtype, device=x.device).masked_fill(~valid, float("-inf"))
            mask = mask[:, None, None, :]
        return pool(x, attn_mask=mask)
    return torch.cat([pool(x[i : i + 1, valid[i]]) for i in range(x.shape[0])])


def classifier(model: nn.Module, pooled: Tensor, prefix: Tensor, pre_logits: bool, training: bool) -> Tensor:
    """timm's head after pooling: ``fc_norm``, dropout, ``head``; DeiT distilled averages its class and
    distillation heads at inference (``prefix`` ``(B, P, D)``: its two tokens) as timm does."""
    if hasattr(model, "head_dist"):
        x, x_dist = model.head_drop(prefix[:, 0]), model.head_drop(prefix[:, 1])
        if pre_logits:
            return (x + x_dist) / 2
        x, x_dist = model.head(x), model.head_dist(x_dist)
        if getattr(model, "distilled_training", False) and training:
            return x, x_dist  # the two heads apart, as timm trains them with distillation
        return (x + x_dist) / 2
    x = model.head_drop(model.fc_norm(pooled))
    return x if pre_logits else model.head(x)
