"""The split decision: does a parent patch lose information its four children would keep?"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import Mlp
from torch import Tensor, nn

# the decision module's defaults, written here once (the tokenizer, the model's config.json and the
# task's `TokenizerSettings` take them from here)
DECISION_DIM = 128
DECISION_HEADS = 4
# what a patch's decision reads besides the patch: its 4 children (the paper's), or also every finest
# patch under it
DECISION_CONTEXTS = ("children", "descendants")
# what the attention reads of each patch: its embedding through linear maps (the paper's), or through a
# small residual MLP first (`SplitDecision`'s ``token_mlp``)
DECISION_FEATURES = ("linear", "mlp")


class SplitDecision(nn.Module):
    """p(split) for each candidate parent from the parent and its four children.

    The parent's embedding is the query of a small multi-head cross-attention over its children
    (plus a learned quadrant embedding, so the module knows which child is where); an MLP on
    ``[parent, summary]`` gives the split logit. Everything runs in a narrow ``dim`` so the module
    costs a few percent of one transformer block per token.

    Inputs are detached: the policy reads the embeddings but its imitation and PPO losses do not
    reshape them, so the backbone's features only answer to the task loss.

    With ``budget_conditioned`` the module also reads the token budget of each image: a small
    MLP of the budget gives a FiLM scale and shift of the MLP's input (zero-initialised, so the
    module starts as the unconditioned one), and one policy learns where tokens go at every
    budget of its range.

    With ``see_descendants`` a parent two or more levels above the finest also attends to every
    finest-level patch it covers (the paper's module sees the four children only). A coarse patch's
    children are themselves downsampled, so detail that only the finest patches resolve (a 2 px
    pattern under a 32 px patch) is invisible to the coarse decision without it; the finest
    embeddings are computed for every patch anyway, so the module reads them at no backbone cost.

    With ``token_mlp`` every patch's normalised embedding first passes a residual MLP (``D -> 2 dim ->
    D``, its last layer zero-initialised, so the module starts as the linear one). Keys and queries
    linear in a patch's embedding score a patch by a linear function of its pixels, and a stripe or
    checker pattern at one phase embeds as minus itself at the opposite phase: the attention cannot
    tell a patterned patch from a flat one, nor find the one textured object among the descendants,
    whatever the width. A nonlinearity per patch can. On the hard classification twin without
    annotations at 0.3 of the tokens it brought the policy from 0.016-0.035 under the annotation
    oracle to within 0.007 of it (docs/loss_labels.md, "A nonlinearity per patch").
    """

    def __init__(
        self,
        embed_dim: int,
        dim: int = DECISION_DIM,
        num_heads: int = DECISION_HEADS,
        mlp_ratio: float = 2.0,
        budget_conditioned: bool = False,
        see_descendants: bool = False,
        token_mlp: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"decision_dim={dim} must be divisible by decision_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.norm = nn.LayerNorm(embed_dim)
        self.token_mlp: nn.Module | None = None
        if token_mlp:
            self.token_mlp = Mlp(embed_dim, hidden_features=2 * dim, out_features=embed_dim)
            nn.init.zeros_(self.token_mlp.fc2.weight)
            nn.init.zeros_(self.token_mlp.fc2.bias)
        self.query = nn.Linear(embed_dim, dim)
        self.key_value = nn.Linear(embed_dim, 2 * dim)
        self.quadrant = nn.Parameter(torch.zeros(4, dim))
        nn.init.trunc_normal_(self.quadrant, std=0.02)
        self.descendant: nn.Parameter | None = None  # marks the finest patches among the keys
        if see_descendants:
            self.descendant = nn.Parameter(torch.zeros(1, dim))
            nn.init.trunc_normal_(self.descendant, std=0.02)
        self.mlp = Mlp(2 * dim, hidden_features=int(mlp_ratio * dim), out_features=1)
        self.budget_film: nn.Module | None = None
        if budget_conditioned:
            self.budget_film = nn.Sequential(nn.Linear(2, dim), nn.GELU(), nn.Linear(dim, 4 * dim))
            nn.init.zeros_(self.budget_film[-1].weight)
            nn.init.zeros_(self.budget_film[-1].bias)

    @property
    def budget_conditioned(self) -> bool:
        return self.budget_film is not None

    @property
    def sees_descendants(self) -> bool:
        return self.descendant is not None

    @property
    def features(self) -> str:
        """What the attention reads of each patch (one of `DECISION_FEATURES`)."""
        return DECISION_FEATURES[self.token_mlp is not None]

    def project(self, level_tokens: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """The per-token work, once per level: LayerNorm (and the token MLP), then the query of every
        patch that is a parent (every level but the finest) and the keys and values of every patch
        that is a child (every level but the coarsest), ``(..., dim)`` and ``(..., 2 * dim)``.

        Done before the patches are grouped by parent, on each level's grid as it comes: grouping
        then moves ``2 * dim`` values per patch instead of the embedding's ``D``, and a decision
        module that reads descendants reuses the finest level's keys instead of projecting the
        finest patches again for every level above (the tokenizer's cost, docs/performance.md)."""
        last = len(level_tokens) - 1
        queries, keys_values = [], []
        for k, tokens in enumerate(level_tokens):
            normed = self.norm(tokens.detach())
            if self.token_mlp is not None:
                normed = normed + self.token_mlp(normed)
            if k < last:
                queries.append(self.query(normed))
            if k > 0:
                keys_values.append(self.key_value(normed))
        return queries, keys_values

    def decide(
        self,
        query: Tensor,
        children: Tensor,
        budget: Tensor | None = None,
        descendants: Tensor | None = None,
        key_mask: Tensor | None = None,
    ) -> Tensor:
        """Split logits from projected parents and children (`project`).

        Args:
            query: ``(B, N, dim)`` the parents' queries.
            children: ``(B, N, 4, 2 * dim)`` keys and values of each parent's children.
            budget: ``(B,)`` token budget of each image (budget-conditioned modules only).
            descendants: ``(B, N, M, 2 * dim)`` keys and values of the finest patches under each
                parent (modules built with ``see_descendants`` only; None for parents of finest patches).
            key_mask: ``(N, keys)`` bool, which children (then descendants) exist: a clipped edge parent
                has fewer (None: all do). The first child always exists.
        """
        if self.budget_conditioned and budget is None:
            raise ValueError(
                "this decision module is budget-conditioned: pass the token budget of each image"
            )
        k, v = children.chunk(2, dim=-1)  # (..., 4, dim)
        k = k + self.quadrant.to(k.dtype)
        if descendants is not None:
            if self.descendant is None:
                raise ValueError("descendants given to a decision module built without see_descendants")
            dk, dv = descendants.chunk(2, dim=-1)  # (..., M, dim)
            k = torch.cat([k, dk + self.descendant.to(dk.dtype)], dim=-2)
            v = torch.cat([v, dv], dim=-2)
        heads = (*query.shape[:-1], self.num_heads, self.head_dim)
        qh = query.view(heads)
        kh = k.view(*k.shape[:-1], self.num_heads, self.head_dim)
        vh = v.view(*v.shape[:-1], self.num_heads, self.head_dim)
        attn = torch.einsum("...hd,...chd->...hc", qh, kh) * self.head_dim**-0.5
        if key_mask is not None:
            attn = attn.masked_fill(~key_mask[:, None, :], float("-inf"))
        summary = torch.einsum("...hc,...chd->...hd", attn.softmax(dim=-1), vh).reshape(query.shape)
        features = torch.cat([query, summary], dim=-1)
        if self.budget_film is not None:
            b = budget.to(features.dtype).view(-1, 1)
            scale, shift = self.budget_film(torch.cat([b, b.clamp(min=1e-3).log()], -1)).chunk(2, dim=-1)
            features = features * (1 + scale[:, None]) + shift[:, None]
        return self.mlp(features).squeeze(-1)
