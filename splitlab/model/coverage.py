"""Does SPLIT run my ViT exactly? `check_backbone` answers for any timm model.

The contract is uniform equivalence: with every patch split down to the finest level, a `SplitModel`
built by `SplitModel.from_timm` gives the timm model's own ``forward`` (logits) and
``forward_features`` to float tolerance, or it refuses the model in one line saying why. This runs
that check on one model (random weights, CPU, a batch of random images), for `scripts/backbones.py`
(which writes ``docs/backbones.md``), the coverage tests, and a user trying a backbone of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import timm
import torch
from torch import nn

from splitlab.model.base import SplitModel

TOLERANCE = 1e-5  # the contract's: logits and features of the uniform layout against timm's


@dataclass(frozen=True)
class Coverage:
    """What `check_backbone` found for one model.

    Attributes:
        name: the timm model name (with the arguments it was built with, if any).
        grid: its finest patch grid ``(rows, cols)``.
        status: ``equal`` (the uniform layout gives timm's outputs), ``differs`` (it runs and does not:
            a bug), ``refused`` (one line says why), or ``unavailable`` (the installed timm cannot build it).
        detail: the refusal's message, or the largest differences.
        logits_diff, features_diff: the largest absolute differences (NaN when refused).
    """

    name: str
    grid: tuple[int, int]
    status: str
    detail: str
    logits_diff: float = float("nan")
    features_diff: float = float("nan")


def check_backbone(
    model: str | nn.Module, batch: int = 2, seed: int = 0, tolerance: float = TOLERANCE, **kwargs: Any
) -> Coverage:
    """Build ``model`` (a timm name with ``timm.create_model`` ``kwargs``, random weights, a 5-class head
    unless ``num_classes`` says otherwise; or a timm model you built, with a head), wrap it with
    `SplitModel.from_timm` and compare the uniform layout's logits and features with timm's own on
    ``batch`` random images. A refusal is reported, not raised."""
    torch.manual_seed(seed)
    label = model if isinstance(model, str) else type(model).__name__
    if kwargs:
        label += f" ({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
    if isinstance(model, str):
        try:
            model = timm.create_model(model, pretrained=False, **{"num_classes": 5, **kwargs})
        except Exception as err:  # a family or setting this timm does not have
            why = f"timm {timm.__version__} cannot build it ({type(err).__name__}: {str(err)[:120]})"
            return Coverage(label, (0, 0), "unavailable", why)
    vit = model.eval()
    embed = getattr(vit, "patch_embed", None)
    grid = tuple(int(g) for g in getattr(embed, "grid_size", (0, 0)))
    try:
        split = SplitModel.from_timm(vit).eval()
    except ValueError as err:
        return Coverage(label, grid, "refused", str(err))
    images = torch.randn(batch, 3, *split.backbone.img_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits, features = vit(images), vit.forward_features(images)
        layout = split.layout(images, policy="uniform")
        packed = split.backbone(layout)
        mine_logits = split.forward_layout(layout) if split.task == "classification" else None
        mine_features = torch.stack(packed.per_image())
    logits_diff = float((mine_logits - logits).abs().max())
    features_diff = float((mine_features - features).abs().max())
    worst = max(logits_diff, features_diff)
    status = "equal" if worst <= tolerance else "differs"
    return Coverage(
        label,
        grid,
        status,
        f"logits {logits_diff:.1e}, features {features_diff:.1e}",
        logits_diff,
        features_diff,
    )


# The families checked (docs/backbones.md): (family, timm name, create_model arguments beyond depth 2).
# Real widths and grids (27 x 27, 37 x 37 and non-square among them), two blocks, random weights.
FAMILIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("ViT (class token)", "vit_small_patch16_224", {}),
    ("ViT at 384 px", "vit_small_patch16_384", {}),
    ("ViT, non-square 24 x 32 grid", "vit_small_patch16_224", {"img_size": (384, 512)}),
    ("ViT, 27 x 27 grid", "vit_small_patch16_224", {"img_size": 432}),
    ("ViT, mean pool (gap)", "vit_medium_patch16_gap_256", {}),
    ("ViT, registers", "vit_medium_patch16_reg4_gap_256", {}),
    ("ViT, max pool", "vit_small_patch16_224", {"global_pool": "max"}),
    ("ViT, PRR attention pool", "vit_small_patch16_224", {"global_pool": "prr"}),
    ("DeiT", "deit_small_patch16_224", {}),
    ("DeiT distilled (two heads)", "deit_small_distilled_patch16_224", {}),
    ("DeiT III", "deit3_small_patch16_224", {}),
    ("CLIP", "vit_base_patch16_clip_224", {}),
    ("CLIP, QuickGELU", "vit_base_patch16_clip_quickgelu_224", {}),
    ("SigLIP / SigLIP 2 (map attention pool)", "vit_base_patch16_siglip_224", {}),
    ("SigLIP, mean pool", "vit_base_patch16_siglip_gap_224", {}),
    ("SigLIP-so400m/14 at 384 (27 x 27)", "vit_so400m_patch14_siglip_384", {}),
    ("DINOv2 at 518 (37 x 37)", "vit_small_patch14_dinov2", {}),
    ("DINOv2 with registers", "vit_small_patch14_reg4_dinov2", {}),
    ("DINOv3 (RoPE)", "vit_small_patch16_dinov3", {}),
    ("EVA-02 (RoPE, SwiGLU)", "eva02_small_patch14_224", {}),
    ("EVA-02 CLIP", "eva02_base_patch16_clip_224", {}),
    ("RoPE ViT (axial)", "vit_small_patch16_rope_224", {}),
    ("RoPE ViT (mixed, per head)", "vit_small_patch16_rope_mixed_224", {}),
    ("RoPE ViT + absolute position", "vit_small_patch16_rope_ape_224", {}),
    ("RoPE ViT, register, mean pool", "vit_base_patch16_rope_reg1_gap_256", {}),
    ("Perception Encoder", "vit_pe_core_small_patch16_384", {}),
    ("AIMv2", "aimv2_large_patch14_224", {}),
    ("FlexiViT (15 x 15 grid)", "flexivit_small", {}),
    ("BEiT", "beit_base_patch16_224", {}),
    ("ViT, relative position", "vit_relpos_small_patch16_224", {}),
    ("SAM ViT", "samvit_base_patch16", {}),
    ("ViT-ResNet hybrid", "vit_base_r50_s16_224", {}),
    ("MobileCLIP ViT (conv stem)", "vit_base_mci_224", {}),
    ("ViT, parallel blocks", "vit_base_patch16_xp_224", {}),
    ("NaFlexViT", "naflexvit_base_patch16_gap", {}),
)
# the few `make test` checks: one of each mechanism (class/distillation/register tokens, attention
# pool, RoPE per token and per head, an odd grid, a refusal); the full list is a slow test
SHORT = (
    "DeiT distilled (two heads)",
    "SigLIP / SigLIP 2 (map attention pool)",
    "ViT, 27 x 27 grid",
    "EVA-02 (RoPE, SwiGLU)",
    "RoPE ViT (mixed, per head)",
    "ViT, registers",
    "BEiT",
)
