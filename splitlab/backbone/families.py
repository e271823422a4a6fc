"""Which timm ViTs `PackedViT` runs, and a one-line refusal naming why for the rest.

`PackedViT` reuses a timm model's own modules (patch embedding, blocks, norms, head) and replaces
only what a packed sequence changes: the position embedding of coarse tokens, the attention (kept
inside each image) and the pooling. A model whose computation has any other part that depends on
the token grid (a relative position bias, windowed attention, a CNN stem, a fused block) would run
and be silently wrong, so it is refused here, before any weight is read. `docs/backbones.md` lists
every family checked against timm's own forward (`scripts/backbones.py` regenerates it).
"""

from __future__ import annotations

import inspect

from timm.layers import Attention, AttentionPoolLatent, AttentionRope, PatchEmbed
from timm.models.eva import Eva, EvaAttention
from timm.models.vision_transformer import VisionTransformer
from torch import nn

try:
    from timm.layers.attention_pool import AttentionPoolPrr
except ImportError:  # pragma: no cover - a timm without PRR pooling
    AttentionPoolPrr = None

# the families a packed sequence cannot carry, and why (class name -> reason)
REFUSED = {
    "Beit": "its relative position bias is indexed by the uniform grid",
    "VisionTransformerRelPos": "its relative position bias is indexed by the uniform grid",
    "VisionTransformerSAM": "its windowed attention and relative positions assume the uniform grid",
    "Hiera": "its windowed (mask-unit) attention assumes the uniform grid",
    "NaFlexVit": "it packs variable-size inputs its own way (use a VisionTransformer or Eva model)",
}
SUPPORTED = (VisionTransformer, Eva)
PATCHED_NAMES = (
    "PackedAttention",
    "PackedEvaAttention",
    "PackedAttentionRope",
)  # timm's, already patched: a model wrapped again


def check_family(model: nn.Module, name: str) -> None:
    """Raise one line naming what of ``model`` a packed sequence cannot reproduce; nothing otherwise."""
    kind = type(model).__name__
    if not isinstance(model, SUPPORTED):
        why = REFUSED.get(
            kind, "PackedViT runs timm's VisionTransformer (DeiT, CLIP, SigLIP, DINOv2, ...) and Eva"
        )
        raise ValueError(f"model_name={name!r} builds a timm {kind}, which is not supported: {why}")
    embed = model.patch_embed
    if type(embed) is not PatchEmbed:
        raise ValueError(
            f"model_name={name!r}: its patch embedding {type(embed).__name__} (a CNN stem or other) is not "
            "supported: coarse tokens are embedded with timm's PatchEmbed (one linear projection per patch)"
        )
    if getattr(embed, "dynamic_img_pad", False):
        raise ValueError(
            f"model_name={name!r} pads images to whole patches (dynamic_img_pad=True): build it with "
            "dynamic_img_pad=False (splitlab reads whole patches, as timm does without it)"
        )
    for block in model.blocks:
        attn = getattr(block, "attn", None)
        if attn is None:
            raise ValueError(
                f"model_name={name!r}: its block type {type(block).__name__} fuses attention with the MLP "
                "(no separate attn), which packed attention cannot reach"
            )
        if "attn_mask" not in inspect.signature(block.forward).parameters:
            raise ValueError(
                f"model_name={name!r}: its block type {type(block).__name__} takes no attn_mask, "
                "so packed attention cannot reach it (timm >= 1.0.20 blocks do)"
            )
        if (
            type(attn) not in (Attention, EvaAttention, AttentionRope)
            and type(attn).__name__ not in PATCHED_NAMES
        ):
            raise ValueError(
                f"model_name={name!r}: attention type {type(attn).__name__} is not timm's Attention, "
                "EvaAttention or AttentionRope, which PackedViT supports"
            )
    pool = getattr(model, "attn_pool", None)
    if pool is not None:
        if isinstance(pool, AttentionPoolLatent) and pool.pos_embed is not None:
            raise ValueError(
                f"model_name={name!r}: its attention pool adds a position embedding per token of the "
                "uniform grid, which a shorter sequence does not have"
            )
        prr = AttentionPoolPrr is not None and isinstance(pool, AttentionPoolPrr)
        if not (isinstance(pool, AttentionPoolLatent) or prr):
            raise ValueError(
                f"model_name={name!r}: its attention pool {type(pool).__name__} is not supported on packed features"
            )
