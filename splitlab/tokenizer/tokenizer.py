"""`SplitTokenizer`: images -> multi-scale embeddings -> split decisions -> `TokenLayout`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import splitlab.tokenizer.policy as policy
from splitlab.tokenizer.decision import DECISION_DIM, DECISION_HEADS, SplitDecision
from splitlab.tokenizer.embed import EmbeddingSource, MultiScalePatchEmbed, child_mask, space_to_depth
from splitlab.tokenizer.layout import TokenLayout
from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.operating_points import OperatingPoints
from splitlab.tokenizer.quadtree import build_layout, cap_fraction, cap_splits

Mode = Literal["sample", "threshold", "labels", "scores"]
MODES = ("sample", "threshold", "labels", "scores")


def finest_under(finest: Tensor, side: int) -> tuple[Tensor, Tensor | None] | None:
    """The finest patches under each parent of ``side`` x ``side`` finest cells, from the finest level
    ``(B, Hf, Wf, D)``: ``(B, h*w, side*side, D)`` and which of them exist ``(h*w, side*side)`` (None
    where all do; a clipped parent's missing ones are zeros); None when they are its children (``side`` 2)."""
    if side <= 2:
        return None
    b, hf, wf, d = finest.shape
    h, w = -(-hf // side), -(-wf // side)
    mask = None
    if (h * side, w * side) != (hf, wf):
        finest = F.pad(finest, (0, 0, 0, w * side - wf, 0, h * side - hf))
        exists = torch.zeros(h * side, w * side, dtype=torch.bool, device=finest.device)
        exists[:hf, :wf] = True
        mask = exists.view(h, side, w, side).permute(0, 2, 1, 3).reshape(h * w, side * side)
    grouped = finest.reshape(b, h, side, w, side, d).permute(0, 1, 3, 2, 4, 5)
    return grouped.reshape(b, h * w, side * side, d), mask


def join_masks(parts: Sequence[tuple[int, int, Tensor | None]], dim: int) -> Tensor | None:
    """Key masks ``(rows, keys)`` joined along ``dim`` (0: more parents, 1: more keys), each given as
    ``(rows, keys, mask or None)`` where None means every key exists; None when every part is."""
    given = [m for _, _, m in parts if m is not None]
    if not given:
        return None
    full = [
        torch.ones(r, k, dtype=torch.bool, device=given[0].device) if m is None else m for r, k, m in parts
    ]
    return torch.cat(full, dim)


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
        budget_points: the token budgets the policy is trained for, ascending. One budget (or none):
            an unconditioned policy; several: the decision module reads each image's budget and
            one policy serves every budget between the first and the last.
        see_descendants: a coarse decision also reads the finest patches it covers (`SplitDecision`).
        token_mlp: every patch passes a residual MLP before the attention reads it (`SplitDecision`).
    """

    def __init__(
        self,
        embed_dim: int,
        levels: Sequence[int] | Levels,
        decision_dim: int = DECISION_DIM,
        decision_heads: int = DECISION_HEADS,
        budget_points: Sequence[float] = (),
        see_descendants: bool = False,
        token_mlp: bool = False,
    ) -> None:
        super().__init__()
        self.levels = Levels.build(levels)
        if self.levels.num < 2:  # the walk handles one level (the uniform grid), a policy does not
            raise ValueError(
                f"levels={self.levels.sizes}: SPLIT needs at least two patch sizes (a patch and its "
                "four children) to decide anything, e.g. levels=(64, 32, 16)"
            )
        for b in budget_points:
            self.levels.check_fraction(b, "budget_points")
        self.embed = MultiScalePatchEmbed(embed_dim, self.levels)
        self.decision = SplitDecision(
            embed_dim,
            decision_dim,
            decision_heads,
            budget_conditioned=len(budget_points) > 1,
            see_descendants=see_descendants,
            token_mlp=token_mlp,
        )
        self.operating_points = OperatingPoints(list(budget_points) or [1.0])

    @property
    def budget_conditioned(self) -> bool:
        """Whether one policy serves a range of budgets (the decision module reads the budget)."""
        return self.decision.budget_conditioned

    def budget_of(self, budget: float | Tensor | None, batch: int, device: torch.device) -> Tensor:
        """``(B,)`` budgets: ``budget`` broadcast, or the one trained budget of an unconditioned policy."""
        if budget is None:
            if self.budget_conditioned:
                lo, hi = self.operating_points.range
                raise ValueError(f"this policy serves budgets [{lo:g}, {hi:g}]: pass the budget to use")
            return self.operating_points.budgets[:1].to(device, torch.float32).expand(batch)
        if isinstance(budget, Tensor):
            return budget.to(device, torch.float32).expand(batch)
        # a fill on the device: no host-to-device copy, no sync (the batch's one sync is the walk's)
        return torch.full((batch,), float(budget), dtype=torch.float32, device=device)

    def decision_logits(self, tokens: Sequence[Tensor], budget: float | Tensor | None = None) -> list[Tensor]:
        """Split logits for every patch of every non-finest level, in one call of the module."""
        if self.levels.num == 1:
            return []
        # LayerNorm and projections per token on each level's grid, then grouped by parent: the
        # grouping copies 2 * decision_dim values per patch, not the embedding's width
        queries, keys_values = self.decision.project(tokens)
        parents = [q.flatten(1, 2) for q in queries]
        children = [space_to_depth(kv).flatten(1, 2) for kv in keys_values]
        masks = [child_mask(kv.shape[1:3], kv.device) for kv in keys_values]  # None: every child exists
        masks = [None if m is None else m.flatten(0, 1) for m in masks]
        condition = (
            self.budget_of(budget, tokens[0].shape[0], tokens[0].device) if self.budget_conditioned else None
        )
        if not self.decision.sees_descendants:  # one call for every level: the keys are 4 children each
            if len(parents) == 1:  # two levels: nothing to join (a join copies)
                chunks = [self.decision.decide(parents[0], children[0], condition, key_mask=masks[0])]
            else:
                mask = join_masks([(p.shape[1], 4, m) for p, m in zip(parents, masks, strict=True)], dim=0)
                logits = self.decision.decide(
                    torch.cat(parents, 1), torch.cat(children, 1), condition, key_mask=mask
                )
                chunks = logits.split([p.shape[1] for p in parents], 1)
        else:  # a level's parents cover 4^(levels below) finest patches: one call per level
            chunks = []
            for k, (p, c, m) in enumerate(zip(parents, children, masks, strict=True)):
                descendants, below = finest_under(keys_values[-1], self.levels.cells(k)) or (None, None)
                parts = [(p.shape[1], 4, m)]
                if descendants is not None:
                    parts.append((p.shape[1], descendants.shape[2], below))
                mask = join_masks(parts, dim=1)
                chunks.append(self.decision.decide(p, c, condition, descendants, key_mask=mask))
        return [chunk.view(t.shape[:3]) for chunk, t in zip(chunks, tokens[:-1], strict=True)]

    def decide(
        self,
        tokens: Sequence[Tensor],
        mode: Mode = "threshold",
        labels: Sequence[Tensor] | None = None,
        scores: Sequence[Tensor] | None = None,
        threshold: float | None = None,
        generator: torch.Generator | None = None,
        logits: Sequence[Tensor] | None = None,
        budget: float | Tensor | None = None,
        max_tokens: int | None = None,
    ) -> tuple[list[Tensor], list[Tensor] | None]:
        """Split decisions for every non-finest patch: the one place that samples, thresholds and caps.

        Args:
            tokens: per level ``(B, h_k, w_k, D)`` embeddings from `MultiScalePatchEmbed`.
            mode: ``sample`` (Bernoulli from p(split)), ``threshold`` (split where the logit passes
                the calibrated cut of ``budget``, see `OperatingPoints`, or p > ``threshold`` when
                one is given), ``labels`` (forced decisions, scored under the policy) or ``scores``
                (split where an external per-patch score > ``threshold``; the decision module does
                not run).
            labels: per non-finest level ``(B, h, w)`` bool decisions for ``labels`` mode.
            scores: per non-finest level ``(B, h, w)`` scores for ``scores`` mode.
            threshold: p(split) threshold (``threshold`` mode) or score threshold (``scores`` mode).
            generator: random source for ``sample`` mode.
            logits: the decision module's logits when the caller already has them (PPO computes
                them once per image and reuses them for every rollout).
            budget: the token budget (a float or ``(B,)``); needed by budget-conditioned policies.
            max_tokens: hard cap on each image's tokens: splits are kept most confident first,
                parents before children (`cap_splits`).

        Returns:
            per-level bool decisions and the logits they came from (None in ``scores`` mode).
        """
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        if mode == "sample" and max_tokens is not None:
            raise ValueError(
                "max_tokens with mode='sample': the cap drops sampled splits, so the layout's log-prob "
                "would no longer be that of the decisions taken (PPO's ratios); cap at inference only"
            )
        if mode == "scores":
            given = self._check_per_level("scores", scores, tokens)
            cut = 0.5 if threshold is None else threshold
            decisions = [s > cut for s in given]
            return self._capped(decisions, given, max_tokens, tokens), None
        if logits is None:
            logits = self.decision_logits(tokens, budget)
        logits = list(logits)
        if mode == "sample":
            decisions = policy.sample(logits, generator)
        elif mode == "threshold":
            if threshold is None:
                batch = tokens[0].shape[0]
                max_fraction = None if max_tokens is None else self.cap_fraction(max_tokens, tokens)
                budgets = self.budget_of(budget, batch, tokens[0].device)
                cut = self.operating_points.cut(budgets, max_fraction=max_fraction).view(-1, 1, 1)
            elif 0.0 < threshold < 1.0:
                cut = math.log(threshold / (1.0 - threshold))
            else:
                raise ValueError(f"threshold={threshold}: p(split) thresholds lie in (0, 1)")
            decisions = [lg > cut for lg in logits]
        else:
            decisions = [d.bool() for d in self._check_per_level("labels", labels, tokens)]
        return self._capped(decisions, logits, max_tokens, tokens), logits

    @staticmethod
    def cap_fraction(max_tokens: int, tokens: Sequence[Tensor]) -> float:
        """The token fraction a cap of ``max_tokens`` leaves an image of these grids at most."""
        return cap_fraction(
            max_tokens, tokens[0].shape[1] * tokens[0].shape[2], tokens[-1].shape[1] * tokens[-1].shape[2]
        )

    @staticmethod
    def _capped(
        decisions: list[Tensor], priority: Sequence[Tensor], max_tokens: int | None, tokens: Sequence[Tensor]
    ) -> list[Tensor]:
        if max_tokens is None:
            return decisions
        finest = tuple(tokens[-1].shape[1:3])
        return cap_splits(decisions, [p.detach() for p in priority], int(max_tokens), finest)

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
            images: ``(B, C, H, W)`` (a grid the coarsest level does not divide gets clipped edge patches).
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
