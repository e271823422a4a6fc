"""Backbone FLOP counting (what `splitlab bench` calls the ideal speed-up): by hand and against torch's counter."""

from __future__ import annotations

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from splitlab.backbone import backbone_flops, block_flops


def test_block_flops_by_hand() -> None:
    # N = 5 tokens, D = 8, MLP hidden 32: qkv 5*8*24, proj 5*8*8, mlp 2*5*8*32, QK^T and AV 2*5*5*8 (MACs)
    macs = 5 * 8 * 24 + 5 * 8 * 8 + 2 * 5 * 8 * 32 + 2 * 5 * 5 * 8
    assert block_flops(5, 8, 32) == 2 * macs


def test_backbone_flops_match_torch_flop_counter() -> None:
    model = timm.create_model("test_vit", img_size=64, depth=3).eval()
    for block in model.blocks:  # explicit matmuls: the counter has no formula for CPU flash attention
        block.attn.fused_attn = False
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        for block in model.blocks:
            block(torch.randn(1, 17, model.embed_dim))
    assert backbone_flops(model, [17]) == counter.get_total_flops()
    assert backbone_flops(model, [17, 9]) == backbone_flops(model, [17]) + backbone_flops(model, [9])
