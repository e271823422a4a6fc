"""`PackedViT` and the packed-sequence attention backends (plain PyTorch + timm)."""

from splitlab.backbone.attention import (
    BACKENDS,
    AttentionBackend,
    PackedSequence,
    available_backends,
    check_backend_name,
    flash_attn_importable,
    resolve_backend,
)
from splitlab.backbone.flops import backbone_flops, block_flops
from splitlab.backbone.packed_vit import PackedAttention, PackedFeatures, PackedViT
from splitlab.backbone.rebuild import create_vit

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "PackedAttention",
    "PackedFeatures",
    "PackedSequence",
    "PackedViT",
    "available_backends",
    "backbone_flops",
    "block_flops",
    "check_backend_name",
    "create_vit",
    "flash_attn_importable",
    "resolve_backend",
]
