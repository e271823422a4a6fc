"""`SplitTokenizer`: images -> multi-scale embeddings -> split decisions -> `TokenLayout`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from splitlab.tokenizer import policy
from splitlab.tokenizer.decision import SplitDecision
from splitlab.tokenizer.embed import EmbeddingSource, MultiScalePatchEmbed, space_to_depth
from splitlab.tokenizer.layout import TokenLayout
from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.quadtree import build_layout

Mode = Literal["sample", "threshold", "labels", "scores"]
MODES = ("sample", "threshold", "labels", "scores")


class SplitTokenizer(nn.Module):
    """The SPLIT tokenizer: learned, per-patch, per-level decisions to refine coarse patches.

    The backbone is passed at call time (anything with `EmbeddingSource`'s methods): the
    tokenizer reuses its patch and position embeddings without owning them, so freezing the
    backbone freezes them too and the tokenizer's own parameters stay few.

    Args:
        embed_dim: the backbone's width.
        levels: patch sizes coarse to fine, the finest being the backbone's patch size.
        decision_dim: width of the decision module.
        decision_heads: heads of its cross-attention.
    """

    def __init__(
        self,
        embed_dim: int,
        levels: Sequence[int] | Levels,
        decision_dim: int = 128,
        decision_heads: int = 4,
    ) -> None:
        super().__init__()
        self.levels = Levels.build(levels)
        self.embed = MultiScalePatchEmbed(embed_dim, self.levels)
        self.decision = SplitDecision(embed_dim, decision_dim, decision_heads)

    def decision_logits(self, tokens: Sequence[Tensor]) -> list[Tensor]:
        """Split logits for every patch of every non-finest level, in one call of the module."""
        if self.levels.num == 1:
            return []
        parents = [t.reshape(t.shape[0], -1, t.shape[-1]) for t in tokens[:-1]]
        children = [space_to_depth(t).flatten(1, 2) for t in tokens[1:]]
        logits = self.decision(torch.cat(parents, 1), torch.cat(children, 1))
        sizes = [p.shape[1] for p in parents]
        return [chunk.view(t.shape[:3]) for chunk, t in zip(logits.split(sizes, 1), tokens[:-1], strict=True)]

    def decide(
        self,
        tokens: Sequence[Tensor],
        mode: Mode = "threshold",
        labels: Sequence[Tensor] | None = None,
        scores: Sequence[Tensor] | None = None,
        threshold: float = 0.5,
        generator: torch.Generator | None = None,
        logits: Sequence[Tensor] | None = None,
    ) -> tuple[list[Tensor], list[Tensor] | None]:
        """Split decisions for every non-finest patch: the one place that samples and thresholds.

        Args:
            tokens: per level ``(B, h_k, w_k, D)`` embeddings from `MultiScalePatchEmbed`.
            mode: ``sample`` (Bernoulli from p(split)), ``threshold`` (split where p > ``threshold``),
                ``labels`` (forced decisions, scored under the policy) or ``scores`` (split where an
                external per-patch score > ``threshold``; the decision module does not run).
            labels: per non-finest level ``(B, h, w)`` bool decisions for ``labels`` mode.
            scores: per non-finest level ``(B, h, w)`` scores for ``scores`` mode.
            threshold: p(split) threshold (``threshold`` mode) or score threshold (``scores`` mode).
            generator: random source for ``sample`` mode.
            logits: the decision module's logits when the caller already has them (PPO computes
                them once per image and reuses them for every rollout).

        Returns:
            per-level bool decisions and the logits they came from (None in ``scores`` mode).
        """
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        if mode == "scores":
            return [s > threshold for s in self._check_per_level("scores", scores, tokens)], None
        logits = self.decision_logits(tokens) if logits is None else list(logits)
        if mode == "sample":
            return policy.sample(logits, generator), logits
        if mode == "threshold":
            if not 0.0 < threshold < 1.0:
                raise ValueError(f"threshold={threshold}: p(split) thresholds lie in (0, 1)")
            cut = math.log(threshold / (1.0 - threshold))
            return [lg > cut for lg in logits], logits
        return [d.bool() for d in self._check_per_level("labels", labels, tokens)], logits

    def tokenize(self, tokens: Sequence[Tensor], mode: Mode = "threshold", **kwargs: Any) -> TokenLayout:
        """Decide (see `decide` for ``mode`` and its arguments), then walk: embeddings -> `TokenLayout`."""
        decisions, logits = self.decide(tokens, mode, **kwargs)
        if logits is not None:
            logits = [lg.detach() for lg in logits]
        return build_layout(tokens, decisions, self.levels, logits)

    def forward(
        self, images: Tensor, source: EmbeddingSource, mode: Mode = "threshold", **kwargs: Any
    ) -> TokenLayout:
        """Tokenize a batch: embed -> decide -> walk.

        Args:
            images: ``(B, C, H, W)``, H and W divisible by the coarsest level.
            source: the backbone whose patch and position embeddings are used.
            mode, **kwargs: see `decide`.
        """
        if source.patch_size != self.levels.finest:
            raise ValueError(
                f"levels={self.levels.sizes}: the finest level must equal the backbone's patch size "
                f"({source.patch_size})"
            )
        tokens, _ = self.embed(images, source)
        return self.tokenize(tokens, mode, **kwargs)

    def _check_per_level(
        self, name: str, given: Sequence[Tensor] | None, tokens: Sequence[Tensor]
    ) -> list[Tensor]:
        expected = [tuple(t.shape[:3]) for t in tokens[:-1]]
        if given is None or len(given) != len(expected):
            raise ValueError(
                f"mode={name!r} needs {name}: one tensor per non-finest level with shapes {expected}"
            )
        for g, shape in zip(given, expected, strict=True):
            if tuple(g.shape) != shape:
                raise ValueError(
                    f"{name} shapes {[tuple(x.shape) for x in given]} do not match the grids {expected}"
                )
        return [g.to(tokens[0].device) for g in given]
