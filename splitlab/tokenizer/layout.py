"""`TokenLayout`: a batch of mixed-resolution token sequences, packed image after image."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from splitlab.tokenizer.levels import Levels


@dataclass
class TokenLayout:
    """Packed mixed-resolution tokens of a batch and where each one sits.

    Tokens are packed image after image (``cu_seqlens`` marks the boundaries) and, within an
    image, coarse level first, raster order within a level; a uniform layout is therefore in
    timm's raster order. CLS and register tokens are not part of the layout: the backbone adds
    them.

    Attributes:
        tokens: ``(T, D)`` embeddings (content + position + level), ready for the blocks.
        cu_seqlens: ``(B + 1,)`` int32 offsets of each image's tokens in ``tokens``.
        seqlens: host copy of the per-image token counts (the one host sync of a batch).
        levels: the quadtree's patch sizes.
        level: ``(T,)`` level index of each token (0 = coarsest).
        boxes: ``(T, 4)`` ``(x0, y0, x1, y1)`` of each token in finest-grid cells.
        image_index: ``(T,)`` image of each token.
        cover_index: ``(B, Hf, Wf)`` index into ``tokens`` of the token covering each finest cell.
        fraction: ``(B,)`` tokens / finest uniform grid (CLS excluded).
        decisions: per non-finest level, ``(B, h, w)`` bool split decisions (False where no decision
            was taken).
        candidates: per non-finest level, ``(B, h, w)`` bool: where a decision was taken.
        logits: per non-finest level, ``(B, h, w)`` split logits of the decision module, if one ran
            (`splitlab.tokenizer.policy` scores ``decisions`` under them).
    """

    tokens: Tensor
    cu_seqlens: Tensor
    seqlens: list[int]
    levels: Levels
    level: Tensor
    boxes: Tensor
    image_index: Tensor
    cover_index: Tensor
    fraction: Tensor
    decisions: list[Tensor] = field(default_factory=list)
    candidates: list[Tensor] = field(default_factory=list)
    logits: list[Tensor] | None = None

    @property
    def batch_size(self) -> int:
        """Number of images."""
        return len(self.seqlens)

    @property
    def max_seqlen(self) -> int:
        """Longest image sequence (tokens only)."""
        return max(self.seqlens)

    @property
    def grid_size(self) -> tuple[int, int]:
        """Finest uniform grid ``(Hf, Wf)``."""
        return int(self.cover_index.shape[1]), int(self.cover_index.shape[2])

    def unpack_to_grid(self, features: Tensor | None = None) -> Tensor:
        """Spread per-token features over the finest grid: ``(T, C)`` -> ``(B, C, Hf, Wf)``.

        Each token's vector is repeated over every finest cell it covers, so dense heads see a
        regular feature map whatever the layout.
        """
        features = self.tokens if features is None else features
        if features.shape[0] != self.tokens.shape[0]:
            raise ValueError(
                f"features has {features.shape[0]} rows, the layout {self.tokens.shape[0]} tokens"
            )
        grid = features.index_select(0, self.cover_index.reshape(-1))
        b, hf, wf = self.cover_index.shape
        return grid.view(b, hf, wf, -1).permute(0, 3, 1, 2)

    def pool(self, features: Tensor | None = None, weighting: str = "token") -> Tensor:
        """Average per-token features per image: ``(T, C)`` -> ``(B, C)``.

        Args:
            features: per-token features, the layout's tokens by default.
            weighting: ``"token"`` (each token counts once) or ``"area"`` (each token counts by
                the finest cells it covers, i.e. the mean over ``unpack_to_grid``).
        """
        features = self.tokens if features is None else features
        if weighting == "token":
            weights = torch.ones_like(self.level, dtype=features.dtype)
        elif weighting == "area":  # cells covered (a clipped edge patch: fewer than its side squared)
            width = (self.boxes[:, 2] - self.boxes[:, 0]).to(features.dtype)
            weights = width * (self.boxes[:, 3] - self.boxes[:, 1]).to(features.dtype)
        else:
            raise ValueError(f"weighting={weighting!r}: expected 'token' or 'area'")
        total = features.new_zeros(self.batch_size, features.shape[1])
        total = total.index_add(0, self.image_index, features * weights[:, None])
        norm = weights.new_zeros(self.batch_size).index_add(0, self.image_index, weights)
        return total / norm[:, None]

    def split(self, features: Tensor | None = None) -> list[Tensor]:
        """Per-image views of per-token features."""
        features = self.tokens if features is None else features
        return list(features.split(self.seqlens))

    def token_boxes(self) -> list[list[list[int]]]:
        """Each image's tokens as ``[x0, y0, x1, y1, level]``, boxes in pixels (one host read for
        the whole batch, not one per token)."""
        rows = torch.cat([self.boxes * self.levels.finest, self.level[:, None]], 1).tolist()
        out, start = [], 0
        for count in self.seqlens:
            out.append(rows[start : start + count])
            start += count
        return out

    def level_map(self) -> Tensor:
        """``(B, Hf, Wf)`` level index of the token covering each finest cell."""
        return self.level[self.cover_index]

    def select(self, images: Sequence[int]) -> TokenLayout:
        """The layout of the given images alone, in that order: their tokens gathered image after
        image, as if they had been tokenized on their own (what a head that reads only some of a
        batch's images sees: one task's images in a multi-task batch)."""
        images = [int(i) for i in images]
        if not images or min(images) < 0 or max(images) >= self.batch_size:
            raise ValueError(f"images {images} of a batch of {self.batch_size}")
        seqlens = [self.seqlens[i] for i in images]
        device = self.tokens.device
        index = torch.tensor(images, device=device)
        shifts = self._shifts(images)  # each image's first row, old minus new
        rows = self._rows(shifts, seqlens).to(device)  # the old row of every token kept
        cover = self.cover_index.index_select(0, index) - shifts.to(device).view(-1, 1, 1)

        return TokenLayout(
            tokens=self.tokens.index_select(0, rows),
            cu_seqlens=torch.tensor(
                [0, *itertools.accumulate(seqlens)], dtype=self.cu_seqlens.dtype, device=device
            ),
            seqlens=seqlens,
            levels=self.levels,
            level=self.level.index_select(0, rows),
            boxes=self.boxes.index_select(0, rows),
            image_index=torch.repeat_interleave(
                torch.arange(len(images), device=device), torch.tensor(seqlens, device=device)
            ),
            cover_index=cover,
            fraction=self.fraction.index_select(0, index),
            decisions=[d.index_select(0, index) for d in self.decisions],
            candidates=[c.index_select(0, index) for c in self.candidates],
            logits=None if self.logits is None else [lg.index_select(0, index) for lg in self.logits],
        )

    def rows_of(self, images: Sequence[int]) -> Tensor:
        """The token rows of the given images, image after image (as `select` gathers them)."""
        lengths = [self.seqlens[int(i)] for i in images]
        return self._rows(self._shifts(images), lengths).to(self.tokens.device)

    @staticmethod
    def _rows(shifts: Tensor, lengths: Sequence[int]) -> Tensor:
        """Old rows of the tokens of images of ``lengths`` packed alone, from their `_shifts` (host)."""
        return torch.repeat_interleave(shifts, torch.tensor(lengths)) + torch.arange(sum(lengths))

    def _shifts(self, images: Sequence[int]) -> Tensor:
        """``(len(images),)``: where each given image's tokens start here, less where they start when
        the given images alone are packed (host arithmetic: the lengths are on the host)."""
        starts = list(itertools.accumulate(self.seqlens, initial=0))
        kept = list(itertools.accumulate((self.seqlens[int(i)] for i in images), initial=0))
        return torch.tensor([starts[int(i)] - kept[j] for j, i in enumerate(images)])
