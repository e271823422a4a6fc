"""Multi-scale patch embedding that reuses the backbone's own patch embedding at every level."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from splitlab.tokenizer.levels import Levels


class EmbeddingSource(Protocol):
    """What the tokenizer needs from a backbone (`splitlab.backbone.PackedViT` provides it)."""

    patch_size: int
    embed_dim: int

    def embed_patches(self, images: Tensor) -> Tensor:
        """``(B, 3, h*p, w*p)`` -> ``(B, h, w, D)`` with the backbone's patch embedding."""
        ...

    def pos_embed_level(self, finest: tuple[int, int], side: int = 1) -> Tensor | None:
        """``(ceil(Hf / side), ceil(Wf / side), D)`` absolute position embedding of the patches of
        ``side`` x ``side`` cells of the finest grid ``finest`` (clipped at its edges), or None if the
        model has none."""
        ...


def space_to_depth(x: Tensor) -> Tensor:
    """``(B, h2, w2, D)`` -> ``(B, ceil(h2 / 2), ceil(w2 / 2), 4, D)``; children ordered top-left,
    top-right, bottom-left, bottom-right. A clipped parent's missing children (an odd ``h2`` or
    ``w2``) are zeros: `child_mask` says which exist."""
    b, h2, w2, d = x.shape
    if h2 % 2 or w2 % 2:
        x = F.pad(x, (0, 0, 0, w2 % 2, 0, h2 % 2))
        h2, w2 = h2 + h2 % 2, w2 + w2 % 2
    x = x.view(b, h2 // 2, 2, w2 // 2, 2, d).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h2 // 2, w2 // 2, 4, d)


def child_mask(child: tuple[int, int], device: torch.device | None = None) -> Tensor | None:
    """``(ceil(h2 / 2), ceil(w2 / 2), 4)`` bool: which of each parent's children exist on a child grid of
    ``child`` = ``(h2, w2)`` (`space_to_depth`'s order); None where all do (even sides)."""
    h2, w2 = int(child[0]), int(child[1])
    if not (h2 % 2 or w2 % 2):
        return None
    rows = torch.ones(-(-h2 // 2), dtype=torch.bool, device=device)
    cols = torch.ones(-(-w2 // 2), dtype=torch.bool, device=device)
    rows[-1] = h2 % 2 == 0
    cols[-1] = w2 % 2 == 0
    below, right = rows[:, None].expand(-1, cols.numel()), cols[None, :].expand(rows.numel(), -1)
    return torch.stack([torch.ones_like(below), right, below, below & right], -1)


class MultiScalePatchEmbed(nn.Module):
    """Token embeddings for every level of the quadtree in one pass.

    A level-``k`` patch is embedded by the backbone's patch embedding applied to the patch
    downsampled (antialiased) to the finest patch size, so a pretrained backbone understands coarse
    tokens from the first step. Two zero-initialised additions let fine-tuning refine that: a
    projection of the patch's four children (what the downsampling blurred away) and a per-level
    embedding. The position of a coarse patch is the backbone's position embedding resampled to
    that level's grid. The finest level is exactly the backbone's embedding, so an all-fine layout
    reproduces the uniform-grid model.
    """

    def __init__(self, embed_dim: int, levels: Levels) -> None:
        super().__init__()
        self.levels = levels
        self.embed_dim = embed_dim
        coarse = levels.num - 1
        self.child_proj = nn.ModuleList(nn.Linear(4 * embed_dim, embed_dim) for _ in range(coarse))
        self.level_embed = nn.Parameter(torch.zeros(coarse, embed_dim))
        for proj in self.child_proj:
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)

    def content(self, images: Tensor, source: EmbeddingSource) -> list[Tensor]:
        """Each level's patches downsampled (antialiased) to the finest patch size and embedded by
        ``source`` alone, no position, level or children projection: ``(B, h_k, w_k, D)``, coarse to
        fine. The warm-start labels read these from a frozen copy of the initial patch embedding
        (`splitlab.tokenizer.labels.LabelEmbedding`), so their target does not drift."""
        self.levels.check_image(images.shape[-2:])
        rows, cols = self.levels.finest_grid(images.shape[-2:])
        p = self.levels.finest
        raw: list[Tensor] = [source.embed_patches(images)]
        images = images[..., : rows * p, : cols * p]  # the pixels under whole patches, as timm's
        for k in reversed(range(self.levels.num - 1)):
            side = self.levels.cells(k)
            h, w = self.levels.grid_of(k, (rows, cols))
            if (h * side, w * side) != (rows, cols):  # clipped edge patches: what lies past the grid reads 0
                pad = (0, w * side * p - images.shape[-1], 0, h * side * p - images.shape[-2])
                images = F.pad(images, pad)
            small = F.interpolate(
                images, size=(h * p, w * p), mode="bilinear", antialias=True, align_corners=False
            )
            raw.insert(0, source.embed_patches(small))
        return raw

    def forward(self, images: Tensor, source: EmbeddingSource) -> tuple[list[Tensor], list[Tensor]]:
        """Embed ``images`` at every level.

        Returns:
            ``tokens`` (content + position + level, what enters the blocks) and ``raw`` (`content`:
            the source's patch embedding of each level's downsampled patches alone), each a list of
            ``(B, h_k, w_k, D)`` tensors, coarse to fine.
        """
        raw = self.content(images, source)
        finest = (raw[-1].shape[1], raw[-1].shape[2])
        content: list[Tensor] = [raw[-1]]
        for k in reversed(range(self.levels.num - 1)):
            children = space_to_depth(content[0]).flatten(-2)
            content.insert(0, self.child_proj[k](children) + raw[k])  # contiguous first: see below
        tokens = []
        for k, c in enumerate(content):
            # Added uncast, as timm adds its position embedding: under autocast the patch embedding
            # is bf16 and the float32 embeddings promote the sum, so the residual stream that enters
            # the blocks stays float32 as in timm's own forward (bf16 throughout drifted 3x further
            # from the float32 model than timm's bf16 forward does, and broke uniform equivalence).
            # The contiguous operand first: the sum then takes its row-major layout, not the patch
            # embedding's channels-first memory, and the LayerNorms and groupings that read the
            # tokens do not copy them again (a tenth of the tokenizer's time at batch 32, ViT-B).
            pos = source.pos_embed_level(finest, self.levels.cells(k))
            t = c.contiguous() if pos is None else pos + c
            if k < self.levels.num - 1:
                t = t + self.level_embed[k]
            tokens.append(t)
        return tokens, raw
