"""`splitlab bench --dense-ideal`: the speed-up this hardware allows a sequence of SPLIT's length.

The FLOP-ideal speed-up assumes a token costs the same however many tokens a matrix product
holds. A CPU's (and a GPU's) matrix products run less efficiently on fewer rows: on this project's
2-core CPU, timm's ViT-B blocks on one image cost 6.5% more per token at 137 tokens than at 197
(docs/performance.md). The dense ideal times timm's own blocks on a *dense* batch of SPLIT's mean
sequence length (no packing, no tokenizer, no per-image attention) against the same blocks on the
uniform grid's length: the most any packed path of those lengths can reach here. Both run on real
tokens of the batch (activations, not noise: some kernels' speed depends on the values).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from splitlab.metrics import interleaved, pair_spread
from splitlab.model import SplitModel


def _blocks(model: SplitModel, x: Tensor) -> Tensor:
    """timm's blocks and final norm on a dense ``(B, N, D)`` batch (rotary models without their
    rotation, a small share of a block's work)."""
    vit = model.backbone.model
    for block in vit.blocks:
        x = block(x)
    return vit.norm(x)


def dense_ideal(
    model: SplitModel,
    images: Tensor,
    autocast: Any,
    device: torch.device,
    warmup: int,
    iters: int,
    min_seconds: float,
) -> dict[str, Any]:
    """Time timm's blocks on the uniform grid's tokens and on a dense batch of the deployed
    layout's mean length (real tokens of the batch), interleaved as the main comparison is."""
    backbone = model.backbone
    with torch.inference_mode(), autocast:
        layout = model.layout(images)
        packed, _, _ = backbone.pack(layout)
        full, _, _ = backbone.pack(model.layout(images, policy="uniform"))
    batch, width = images.shape[0], packed.shape[-1]
    length = round(packed.shape[1] / batch)  # prefix tokens included, as the packed rows have them
    rows = packed[0]
    if batch * length > rows.shape[0]:  # rounded up: a few rows again
        rows = torch.cat([rows, rows[: batch * length - rows.shape[0]]])
    reduced = rows[: batch * length].reshape(batch, length, width)
    uniform = full[0].reshape(batch, -1, width)

    def run_uniform() -> Any:
        with torch.inference_mode(), autocast:
            return _blocks(model, uniform)

    def run_reduced() -> Any:
        with torch.inference_mode(), autocast:
            return _blocks(model, reduced)

    t_uniform, t_reduced = interleaved(run_uniform, run_reduced, warmup, iters, device, min_seconds)
    return {
        "tokens_per_image": length,
        "tokens_per_image_uniform": uniform.shape[1],
        "speedup": sum(t_uniform) / sum(t_reduced),
        "speedup_spread": pair_spread(t_uniform, t_reduced),
    }
