"""What each split is worth to the task: the loss-derived label source (``warm_start.label_source:
loss``) and the ``loss_oracle`` evaluation row.

A split replaces a patch's token by its four children's. Its worth is how much the task loss falls
when that happens, read through the task's own per-image loss, so it needs no annotations: the
detail a classifier, a detector, a segmenter or a VQA model actually uses, wherever it lies.

Measuring it patch by patch would cost one forward per patch. Instead each level's refinement is
measured as a path integral (integrated gradients): every finest cell holds a copy of the token of
its level-``k`` patch, and moves towards the token of its level-``k + 1`` patch; the gradient of
the per-image loss along that path, times the step, attributes the loss change between the two
grids to the cells (the attributions of one image sum to that change, up to the quadrature's
error). A patch's gain is minus the sum of its cells'. One forward and one backward of the finest
grid per level and step: 2 levels at 1 step cost about 6 forwards of the uniform grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from splitlab.tokenizer import Levels, build_layout, gain_labels

# the per-image task loss ``(B,)`` of the batch's outputs
LossOf = Callable[[Any], Tensor]


def on_finest_grid(tokens: Sequence[Tensor], levels: Levels) -> list[Tensor]:
    """Each level's tokens spread over the finest grid, ``(B, Hf, Wf, D)``: every finest cell holds
    the token of the patch of that level that covers it (a clipped edge patch's cells included)."""
    rows, cols = tokens[-1].shape[1:3]
    spread = []
    for k, level in enumerate(tokens):
        side = levels.cells(k)
        spread.append(level.repeat_interleave(side, 1).repeat_interleave(side, 2)[:, :rows, :cols])
    return spread


def patch_sums(cells: Tensor, side: int) -> Tensor:
    """``(B, Hf, Wf)`` -> ``(B, h, w)``: the sum over each ``side`` x ``side`` patch (clipped at the edge)."""
    if side == 1:
        return cells
    return F.avg_pool2d(cells[:, None], side, ceil_mode=True, divisor_override=1)[:, 0]


def refinement_gains(
    model: Any,
    images: Tensor,
    loss_of: LossOf,
    steps: int = 1,
    tokens: Sequence[Tensor] | None = None,
) -> list[Tensor]:
    """Per non-finest level ``(B, h_k, w_k)``: how much splitting each patch lowers the task loss.

    Args:
        model: a `splitlab.model.SplitModel` (its tokenizer, backbone and ``forward_layout``), in the
            mode the caller wants (the loss is read as the model is).
        images: ``(B, C, H, W)``, preprocessed.
        loss_of: ``loss_of(outputs)``, the per-image loss of the batch's outputs (`LossOf`).
        steps: points of the midpoint rule along each level's path (1: its middle).
        tokens: the batch's level embeddings when the caller has them (`SplitTokenizer.embed`).

    Returns:
        gains, in the loss's units (negative where the finer grid raises the loss); the parameters
        get no gradient.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: at least 1 point per path")
    levels = model.levels
    with torch.no_grad():
        if tokens is None:
            tokens, _ = model.tokenizer.embed(images, model.backbone)
        tokens = [t.detach() for t in tokens]
        spread = on_finest_grid([t.float() for t in tokens], levels)
    everything = [torch.ones(t.shape[:3], dtype=torch.bool, device=t.device) for t in tokens[:-1]]
    gains = []
    for k in range(levels.num - 1):  # one pass per level and point: the memory of one batch's backward
        move = spread[k + 1] - spread[k]
        change = torch.zeros(move.shape[:3], device=move.device)
        for i in range(steps):
            point = spread[k] + (i + 0.5) / steps * move
            with torch.enable_grad():
                finest = point.to(tokens[-1].dtype).requires_grad_(True)
                layout = build_layout([*tokens[:-1], finest], everything, levels)
                loss = loss_of(model.forward_layout(layout)).float()
                (grad,) = torch.autograd.grad(loss.sum(), finest)
            change += (grad.float() * move).sum(-1) / steps  # each cell's share of the loss change
        gains.append(-patch_sums(change, levels.cells(k)))
    return gains


def finest_outputs(model: Any, images: Tensor, tokens: Sequence[Tensor] | None = None) -> Any:
    """The model's outputs on the finest grid (every patch split): the reference that ``fidelity``
    labels keep the outputs of a layout close to."""
    with torch.no_grad():
        if tokens is None:
            tokens, _ = model.tokenizer.embed(images, model.backbone)
        tokens = [t.detach() for t in tokens]
        everything = [torch.ones(t.shape[:3], dtype=torch.bool, device=t.device) for t in tokens[:-1]]
        return model.forward_layout(build_layout(tokens, everything, model.levels))


def per_image_shares(gains: Sequence[Tensor]) -> list[Tensor]:
    """Each image's gains as shares of its own total (absolute) gain: where detail matters *within* the
    image, every image weighted alike. The policy sees the image, not its label: an image the model
    already gets right has tiny gains everywhere, and on the raw scale it would lose its fine tokens to
    the images the model gets wrong, which the policy cannot tell apart (classification hard twin,
    seed 0, no annotations, anchored: 0.923 -> 0.940 top-1 at 0.45; docs/loss_labels.md)."""
    total = sum(g.abs().flatten(1).sum(1) for g in gains).clamp(min=1e-12)
    return [g / total.view(-1, 1, 1) for g in gains]


def gain_split_labels(
    gains: Sequence[Tensor], levels: Levels, budget: float, finest: Sequence[int], shares: bool = True
) -> list[Tensor]:
    """The splits worth most at ``budget`` by ``gains``, each image's as shares of its own total
    (`per_image_shares`) unless ``shares`` is false: the ``loss`` and ``fidelity`` labels, and the
    ``loss_oracle`` (raw gains) and ``fidelity_oracle`` rows."""
    return gain_labels(per_image_shares(gains) if shares else list(gains), levels, budget, finest)


def autograd_ready(value: Any) -> Any:
    """``value`` (a tensor, or lists, tuples and dicts of them) with every inference tensor cloned into
    a plain one: validation runs under `torch.inference_mode`, whose tensors autograd cannot save."""
    if isinstance(value, Tensor):
        return value.clone() if value.is_inference() else value
    if isinstance(value, dict):
        return {k: autograd_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(autograd_ready(v) for v in value)
    if is_dataclass(value) and not isinstance(value, type):  # a multi-task batch's targets
        return replace(
            value, **{f.name: autograd_ready(getattr(value, f.name)) for f in fields(value) if f.init}
        )
    return value
