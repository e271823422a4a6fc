"""The deployed path with static shapes, for ``torch.export`` (and ONNX where its graph allows).

The eager path packs each image's tokens into one variable-length sequence: its shapes follow the
data, and its layout costs one host sync. Under a hard cap every image has at most ``max_tokens``
tokens, so the same computation fits static shapes: each image's kept tokens (coarse level first,
raster order within a level, exactly the packed order) padded to the cap, with a mask that keeps the
padding out of attention and pooling. Embedding, decisions, the cap and the walk are all tensor
ops on fixed grids; no host sync, no data-dependent shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from splitlab.backbone.pooling import classifier, pool_padded
from splitlab.model.base import SplitModel
from splitlab.tokenizer import cap_splits, cover_slots, leaf_masks

EXPORTABLE = ("classification", "segmentation")


class StaticWalk(nn.Module):
    """Images -> each image's kept tokens padded to ``max_tokens``, a validity mask, token counts and
    the token covering each finest cell, at a fixed budget (the learned policy at its calibrated cut)."""

    def __init__(self, model: SplitModel, budget: float, max_tokens: int) -> None:
        super().__init__()
        self.model, self.max_tokens, self.budget = model, int(max_tokens), float(budget)
        points = model.tokenizer.operating_points
        points.check(budget, "budget")
        cut = points.cut(
            torch.tensor([budget], device=points.cuts.device), max_fraction=model.cap_limit(max_tokens)
        )
        self.register_buffer("cut", cut.reshape(()).detach().clone())

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        model = self.model
        tokens, _ = model.tokenizer.embed(images, model.backbone)
        budget = torch.full((images.shape[0],), self.budget, device=images.device)
        logits = model.tokenizer.decision_logits(tokens, budget)
        decisions = [lg > self.cut for lg in logits]
        finest = tuple(tokens[-1].shape[1:3])
        if self.max_tokens < finest[0] * finest[1]:  # a cap that can bind
            decisions = cap_splits(decisions, logits, self.max_tokens, finest)
        keep, _ = leaf_masks(decisions, finest)
        batch, dim = images.shape[0], tokens[0].shape[-1]
        keep_flat = torch.cat([k.reshape(batch, -1) for k in keep], 1)
        every = torch.cat([t.reshape(batch, -1, dim) for t in tokens], 1)
        # kept patches first, in their packed order, then the padding: the smallest of unique keys, so
        # a top-k (ONNX has no stable sort) orders them as a stable sort would
        slots = keep_flat.shape[1]
        key = (~keep_flat).long() * slots + torch.arange(slots, device=images.device)
        order = torch.topk(key, self.max_tokens, dim=1, largest=False, sorted=True).indices
        packed = every.gather(1, order[..., None].expand(-1, -1, dim))
        counts = keep_flat.sum(1)
        valid = torch.arange(self.max_tokens, device=images.device)[None] < counts[:, None]
        slot = keep_flat.long().cumsum(1) - 1  # each kept patch's place in its image's sequence
        cover = cover_slots(keep, slot, model.levels)
        return packed, valid, counts, cover


class StaticSplit(nn.Module):
    """The deployed path of a classification or segmentation `SplitModel` with static shapes.

    ``forward(images)`` returns the task output (classification logits ``(B, C)``; segmentation
    logits ``(B, C, H/4, W/4)``) and each image's token count.
    """

    def __init__(
        self, model: SplitModel, budget: float | None = None, max_fraction: float | None = None
    ) -> None:
        super().__init__()
        if model.task not in EXPORTABLE:
            raise ValueError(
                f"export: a {model.task} model's head does not take static shapes (see docs/inference.md); "
                f"exportable: {', '.join(EXPORTABLE)}"
            )
        if getattr(model.backbone.model, "rope", None) is not None:
            raise ValueError(
                "export: rotary position embeddings (EVA-02) are not exported yet: the padded path "
                "would need each token's rotation per image (see docs/inference.md)"
            )
        model.check_call(budget, max_fraction, "learned")  # a cap under the budget, refused as everywhere
        max_tokens = model.cap_tokens(max_fraction) if max_fraction is not None else model.max_tokens
        finest = model.levels.grid(model.levels.num - 1, model.backbone.img_size)
        max_tokens = finest[0] * finest[1] if max_tokens is None else max_tokens
        self.model = model
        self.walk = StaticWalk(model, model.budget if budget is None else budget, max_tokens)

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        model = self.model
        vit, backbone = model.backbone.model, model.backbone
        packed, valid, counts, cover = self.walk(images)
        batch, prefix_len = images.shape[0], backbone.num_prefix_tokens
        prefix = backbone.prefix_tokens(batch)
        x = torch.cat([prefix.to(packed.dtype), packed], 1)
        keys = torch.cat([valid.new_ones(batch, prefix_len), valid], 1)
        mask = keys[:, None, None, :]  # padding is never attended to
        x = vit.norm_pre(x)
        take = set(model.backbone_indices() or [])
        intermediates = []
        for i, block in enumerate(vit.blocks):
            x = block(x, attn_mask=mask)
            if i in take:
                intermediates.append(x[:, prefix_len:])
        x = vit.norm(x)
        if model.task == "classification":
            return self.classify(x, keys, prefix_len), counts
        return self.segment(intermediates, cover), counts

    def classify(self, x: Tensor, keys: Tensor, prefix_len: int) -> Tensor:
        """timm's head on each image's own rows (``keys``: which are real), as the packed path pools."""
        vit = self.model.backbone.model
        pooled = None if hasattr(vit, "head_dist") else pool_padded(vit, x, keys, prefix_len)
        return classifier(vit, pooled, x[:, :prefix_len], pre_logits=False, training=False)

    def segment(self, intermediates: list[Tensor], cover: Tensor) -> Tensor:
        """Each chosen block's tokens spread over the finest grid, through the pyramid and decode head."""
        head = self.model.head
        batch, hf, wf = cover.shape
        index = cover.reshape(batch, -1, 1)
        grids = [
            t.gather(1, index.expand(-1, -1, t.shape[-1])).reshape(batch, hf, wf, -1).permute(0, 3, 1, 2)
            for t in intermediates
        ]
        inputs = list(head.pyramid(grids).values())
        return head.decode(inputs)


def export_program(
    model: SplitModel,
    example: Tensor,
    budget: float | None = None,
    max_fraction: float | None = None,
    dynamic_batch: bool = True,
) -> Any:
    """``torch.export`` of the static deployed path (eval mode), on ``example`` images."""
    static = StaticSplit(model.eval(), budget, max_fraction).eval()
    shapes = None
    if dynamic_batch:
        shapes = ({0: torch.export.Dim("batch", min=1, max=1024)},)
    with torch.no_grad():
        return torch.export.export(static, (example,), dynamic_shapes=shapes, strict=False)


def save_program(program: Any, path: str | Path, config: dict[str, Any]) -> Path:
    """Write an exported program (``torch.export.load`` reads it) with the model's config beside it."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path), extra_files={"splitlab_config.json": json.dumps(config)})
    return path
