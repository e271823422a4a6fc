"""`PackedViT`: a timm VisionTransformer run on packed mixed-resolution token sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention, AttentionRope, apply_rot_embed_cat, resample_abs_pos_embed
from timm.models.eva import EvaAttention
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.checkpoint import checkpoint

from splitlab.backbone.attention import PackedSequence, check_backend_name, resolve_backend
from splitlab.backbone.families import check_family
from splitlab.backbone.pooling import classifier, includes_prefix, pool_padded
from splitlab.backbone.rebuild import create_vit
from splitlab.backbone.rope import PackedRope
from splitlab.tokenizer.layout import TokenLayout


class PackedAttention(Attention):
    """timm's `Attention`, taught to read a `PackedSequence` as its ``attn_mask``.

    Patched in place onto a model's attention modules (as ToMe patches timm): with an ordinary
    mask, or none, it is timm's own forward, so the dense model keeps working unchanged.
    """

    def forward(self, x: Tensor, attn_mask=None, is_causal: bool = False) -> Tensor:  # type: ignore[override]
        if not isinstance(attn_mask, PackedSequence):
            return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)
        seq = attn_mask
        batch, total, _ = x.shape  # batch == 1: one packed sequence
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        qkv = self.qkv(x).view(batch * total, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)
        # autocast runs qk-norm in float32: flash-attn needs q, k and v in one dtype (SDPA casts itself)
        q, k = self.q_norm(q).type_as(v), self.k_norm(k).type_as(v)
        return attend_and_project(self, seq, q, k, v, gate, (batch, total))


class PackedRotary:
    """The packed forward of timm's attentions that take a rotary embedding (`EvaAttention`,
    `AttentionRope`), mixed in before them: with an ordinary mask, or none, timm's own forward. The
    embedding is given per row (prefix rows are the identity rotation), ``(rows, 2 * head_dim)`` or,
    for per-head RoPE-Mixed, ``(heads, rows, 2 * head_dim)``; grouped-query heads are repeated after
    the rotation, as timm does."""

    def forward(
        self, x: Tensor, rope: Tensor | None = None, attn_mask=None, is_causal: bool = False
    ) -> Tensor:
        if not isinstance(attn_mask, PackedSequence):
            return super().forward(x, rope=rope, attn_mask=attn_mask, is_causal=is_causal)
        batch, total, _ = x.shape
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        q, k, v = self.packed_qkv(x, batch * total)
        q, k = self.q_norm(q).type_as(v), self.k_norm(k).type_as(v)  # as `PackedAttention`
        q, k = rotate(q, k, rope, getattr(self, "rotate_half", False))
        groups = getattr(self, "num_kv_groups", 1)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return attend_and_project(self, attn_mask, q, k, v, gate, (batch, total))


class PackedEvaAttention(PackedRotary, EvaAttention):
    """timm's `EvaAttention` (EVA-02, DINOv3, the RoPE ViTs' Eva blocks) on a packed sequence."""

    def packed_qkv(self, x: Tensor, rows: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(rows, heads, head_dim)`` queries, keys and values, as timm's projections give them."""
        if self.qkv is None:
            return tuple(
                proj(x).view(rows, self.num_heads, -1) for proj in (self.q_proj, self.k_proj, self.v_proj)
            )
        if self.q_bias is None:
            qkv = self.qkv(x)
        elif getattr(self, "qkv_bias_separate", False):
            qkv = self.qkv(x) + torch.cat((self.q_bias, self.k_bias, self.v_bias))
        else:
            qkv = F.linear(x, self.qkv.weight, torch.cat((self.q_bias, self.k_bias, self.v_bias)))
        return qkv.view(rows, 3, self.num_heads, -1).unbind(1)


class PackedAttentionRope(PackedRotary, AttentionRope):
    """timm's `AttentionRope` (the RoPE ViTs, Perception Encoder) on a packed sequence."""

    def packed_qkv(self, x: Tensor, rows: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(rows, heads, head_dim)`` queries, and keys and values of the key-value heads."""
        if self.qkv is not None:
            return self.qkv(x).view(rows, 3, self.num_heads, -1).unbind(1)
        kv_heads = getattr(self, "num_kv_heads", self.num_heads)  # grouped-query heads (timm >= 1.0.2x)
        q = self.q_proj(x).view(rows, self.num_heads, -1)
        return q, self.k_proj(x).view(rows, kv_heads, -1), self.v_proj(x).view(rows, kv_heads, -1)


def attend_and_project(
    module: nn.Module,
    seq: PackedSequence,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gate: Tensor | None,
    shape: tuple[int, int],
) -> Tensor:
    """The end every timm attention shares: attention within each image (``seq``), the output norm,
    the gate where there is one, the projection; ``shape`` is the input's ``(1, rows)``."""
    dropout = module.attn_drop.p if module.training else 0.0
    out = module.norm(seq.attend(q, k, v, scale=module.scale, dropout_p=dropout).reshape(*shape, -1))
    if gate is not None:
        out = out * gate
    return module.proj_drop(module.proj(out))


def rotate(q: Tensor, k: Tensor, rope: Tensor | None, half: bool) -> tuple[Tensor, Tensor]:
    """Rotate packed ``(rows, heads, head_dim)`` queries and keys by a per-row embedding ``(rows, 2 hd)``
    (the same for every head) or per-head ``(heads, rows, 2 hd)`` (RoPE-Mixed); none without one."""
    if rope is None:
        return q, k
    rope = rope[:, None, :] if rope.dim() == 2 else rope.transpose(0, 1)
    return apply_rot_embed_cat(q, rope, half=half).type_as(q), apply_rot_embed_cat(
        k, rope, half=half
    ).type_as(k)


PATCHED = {Attention: PackedAttention, EvaAttention: PackedEvaAttention, AttentionRope: PackedAttentionRope}


@dataclass
class PackedFeatures:
    """What `PackedViT` returns for a batch.

    Attributes:
        prefix: ``(B, P, D)`` CLS and register tokens after the final norm.
        tokens: ``(T, D)`` patch tokens after the final norm, in the layout's order.
        intermediates: ``(T, D)`` patch tokens after each requested block (no final norm).
        layout: the layout the features belong to.
    """

    prefix: Tensor
    tokens: Tensor
    intermediates: list[Tensor]
    layout: TokenLayout

    def select(self, images: Sequence[int]) -> PackedFeatures:
        """The features of the given images alone, in that order (one task's images of a multi-task
        batch, for the head of that task)."""
        rows = self.layout.rows_of(images)
        index = torch.tensor([int(i) for i in images], device=self.prefix.device)
        return PackedFeatures(
            prefix=self.prefix.index_select(0, index),
            tokens=self.tokens.index_select(0, rows),
            intermediates=[x.index_select(0, rows) for x in self.intermediates],
            layout=self.layout.select(images),
        )

    def per_image(self) -> list[Tensor]:
        """``[(P + N_i, D)]`` per image, prefix first: the shape of timm's ``forward_features`` rows."""
        return [torch.cat([p, t]) for p, t in zip(self.prefix, self.layout.split(self.tokens), strict=True)]

    def padded(self) -> tuple[Tensor, Tensor]:
        """Each image's rows (`per_image`) padded to the longest: ``(B, P + max N, D)`` and which rows
        are real ``(B, P + max N)``."""
        rows = self.per_image()
        lengths = torch.tensor([len(r) for r in rows], device=self.tokens.device)
        x = pad_sequence(rows, batch_first=True)
        return x, torch.arange(x.shape[1], device=x.device)[None] < lengths[:, None]


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype attention runs in: autocast's where it is on (the residual stream stays wider)."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


class PackedViT(nn.Module):
    """A timm `VisionTransformer` whose blocks run on a `TokenLayout`'s packed sequence.

    Each image gets its own CLS (and register) tokens; attention stays inside each image through
    the chosen packed-attention backend. The timm model is patched, not forked: its own
    ``forward_features`` still works and gives the uniform-grid reference.

    Args:
        model_name: timm model name, or an already built `VisionTransformer`.
        pretrained: load timm's pretrained weights (needs the hub or its cache).
        checkpoint_path: local weights for offline machines.
        attn_backend: ``auto`` or a name from `splitlab.backbone.attention.BACKENDS`.
        **model_kwargs: passed to ``timm.create_model`` (``img_size``, ``num_classes``, ...).
    """

    def __init__(
        self,
        model_name: str | nn.Module = "vit_tiny_patch16_224",
        pretrained: bool = False,
        checkpoint_path: str = "",
        attn_backend: str = "auto",
        **model_kwargs,
    ) -> None:
        super().__init__()
        check_backend_name(attn_backend)  # before any weight download
        if isinstance(model_name, nn.Module):
            model = model_name
            name = type(model).__name__
        else:
            name = model_name
            model = create_vit(
                model_name, pretrained=pretrained, checkpoint_path=checkpoint_path, **model_kwargs
            )
        check_family(model, name)
        # each token's rotation where the model has RoPE (checked against the module's own table)
        self.rope = PackedRope.build(model, tuple(model.patch_embed.grid_size), name)
        self.model = model
        self.attn_backend = attn_backend
        # Inference-only cache of resampled position embeddings (pos_embed_grid): the bicubic
        # resample of a coarse grid costs as much as the quadtree walk at batch 1.
        self._resampled: dict[tuple[Any, ...], Tensor] = {}
        for block in self.model.blocks:  # patched in place, as ToMe patches timm (`check_family` vetted them)
            if type(block.attn) in PATCHED:
                block.attn.__class__ = PATCHED[type(block.attn)]

    def _apply(self, fn: Any, recurse: bool = True) -> PackedViT:
        self._resampled.clear()  # .to(), .half(), ...: new weights, whatever their versions say
        return super()._apply(fn, recurse)

    @property
    def attn_backend(self) -> str:
        """The packed-attention backend's name (``auto`` resolves per device and dtype at each call)."""
        return self._attn_backend

    @attn_backend.setter
    def attn_backend(self, name: str) -> None:
        self._attn_backend = check_backend_name(name)

    @property
    def patch_size(self) -> int:
        return int(self.model.patch_embed.patch_size[0])

    @property
    def embed_dim(self) -> int:
        return int(self.model.embed_dim)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.model.num_prefix_tokens)

    @property
    def img_size(self) -> tuple[int, int]:
        return tuple(int(s) for s in self.model.patch_embed.img_size)

    @property
    def depth(self) -> int:
        return len(self.model.blocks)

    @property
    def data_config(self) -> dict:
        """timm's preprocessing config (mean, std, input size, interpolation) for this model."""
        return timm.data.resolve_data_config({}, model=self.model)

    def embed_patches(self, images: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, H // p, W // p, D)`` with the model's patch embedding (any size;
        pixels past the last whole patch are left out, as timm's convolution leaves them)."""
        pe = self.model.patch_embed
        x = pe.proj(images).permute(0, 2, 3, 1)
        return pe.norm(x)

    def pos_embed_level(self, finest: tuple[int, int], side: int = 1) -> Tensor | None:
        """``(ceil(Hf / side), ceil(Wf / side), D)`` position embedding of the patches of ``side`` x
        ``side`` cells of the finest grid ``finest``: the model's own on its grid, resampled (bicubic,
        as timm resizes it) to any other, and for a level whose patches the grid clips at its right and
        bottom edges, the mean of the embeddings of the cells each patch covers."""
        pos = self.model.pos_embed
        if pos is None:
            return None
        rows, cols = int(finest[0]), int(finest[1])
        # Computed once per weights under inference mode (an in-place update of the embedding bumps
        # its version, so a changed embedding is a new key); never while autograd, a compiler or export
        # traces, nor for an inference tensor (a model built under inference mode: it has no version).
        tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        cacheable = torch.is_inference_mode_enabled() and not tracing and not pos.is_inference()
        key = (rows, cols, side, pos._version, pos.data_ptr(), pos.device, pos.dtype) if cacheable else None
        if key in self._resampled:
            return self._resampled[key]
        if rows % side or cols % side:  # clipped: the mean of the cells each patch has
            fine = self.pos_embed_level((rows, cols)).permute(2, 0, 1)[None]
            level = F.avg_pool2d(fine, side, ceil_mode=True)[0].permute(1, 2, 0)
        else:
            level = self._resampled_grid((rows // side, cols // side))
        if key is not None:
            if len(self._resampled) >= 16:  # keys of earlier weights or devices
                self._resampled.clear()
            self._resampled[key] = level
        return level

    def _resampled_grid(self, grid: tuple[int, int]) -> Tensor:
        """The model's patch position embedding resampled (bicubic) to ``grid``: ``(h, w, D)``."""
        pos = self.model.pos_embed
        skip = 0 if self.model.no_embed_class else self.num_prefix_tokens
        patch_pos = pos[:, skip:]
        old = tuple(self.model.patch_embed.grid_size)
        if tuple(grid) == old:
            return patch_pos.view(grid[0], grid[1], -1)
        patch_pos = resample_abs_pos_embed(
            patch_pos, new_size=list(grid), old_size=list(old), num_prefix_tokens=0
        )
        return patch_pos.view(grid[0], grid[1], -1)

    def prefix_tokens(self, batch: int) -> Tensor:
        """``(B, P, D)`` class, distillation (DeiT) and register tokens with their position embedding, as
        timm adds them."""
        m = self.model
        own = (m.cls_token, getattr(m, "dist_token", None), getattr(m, "reg_token", None))
        parts = [t.expand(batch, -1, -1) for t in own if t is not None]
        if not parts:
            return m.patch_embed.proj.weight.new_zeros(batch, 0, self.embed_dim)
        prefix = torch.cat(parts, dim=1)
        if m.pos_embed is not None and not m.no_embed_class:
            prefix = prefix + m.pos_embed[:, : self.num_prefix_tokens]
        return prefix

    def pack(self, layout: TokenLayout) -> tuple[Tensor, PackedSequence, Tensor]:
        """Interleave each image's prefix tokens with its layout tokens.

        Returns:
            ``(1, T + B*P, D)`` sequence, its `PackedSequence`, and the rows of the layout tokens.
        """
        batch, prefix_len = layout.batch_size, self.num_prefix_tokens
        tokens = layout.tokens
        device = tokens.device
        backend = resolve_backend(self.attn_backend, device, compute_dtype(tokens))
        seq = PackedSequence.build([n + prefix_len for n in layout.seqlens], device, backend)
        token_rows = torch.arange(tokens.shape[0], device=device) + prefix_len * (layout.image_index + 1)
        prefix = self.prefix_tokens(batch).reshape(-1, tokens.shape[1]) if prefix_len else None
        # the wider of the two, as timm's concatenation of CLS and patch tokens promotes
        dtype = tokens.dtype if prefix is None else torch.promote_types(tokens.dtype, prefix.dtype)
        x = tokens.new_zeros(seq.total, tokens.shape[1], dtype=dtype).index_copy(
            0, token_rows, tokens.to(dtype)
        )
        if prefix is not None:
            x = x.index_copy(0, self._prefix_rows(seq, device), prefix.to(dtype))
        return self.model.pos_drop(x[None]), seq, token_rows

    def forward(self, layout: TokenLayout, indices: int | Sequence[int] | None = None) -> PackedFeatures:
        """Run the blocks on a layout.

        Args:
            layout: tokens from `splitlab.tokenizer.SplitTokenizer` (with this model's embeddings).
            indices: blocks whose outputs to return too: the last ``n`` if an int, else block indices.
        """
        take = self._resolve_indices(indices)
        x, seq, token_rows = self.pack(layout)
        rope = None if self.rope is None else self.packed_rope(layout, seq, token_rows)
        x = self.model.norm_pre(x)
        intermediates = []
        for i, block in enumerate(self.model.blocks):
            extra = {} if rope is None else {"rope": rope[i] if self.rope.per_block else rope}
            if self.model.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x = checkpoint(block, x, attn_mask=seq, use_reentrant=False, **extra)
            else:
                x = block(x, attn_mask=seq, **extra)
            if i in take:
                intermediates.append(x[0].index_select(0, token_rows))
        x = self.model.norm(x)[0]
        tokens = x.index_select(0, token_rows)
        prefix_rows = self._prefix_rows(seq, x.device)
        prefix = x.index_select(0, prefix_rows).view(layout.batch_size, self.num_prefix_tokens, x.shape[-1])
        return PackedFeatures(prefix=prefix, tokens=tokens, intermediates=intermediates, layout=layout)

    def packed_rope(self, layout: TokenLayout, seq: PackedSequence, token_rows: Tensor) -> Tensor:
        """Per-row rotary embedding of the packed sequence: each token at the centre of its cells
        (`splitlab.backbone.rope`), CLS and register rows the identity rotation (sin 0, cos 1), as timm
        leaves prefix tokens. ``(rows, 2 * dim)``, or ``(depth, heads, rows, 2 * head_dim)`` per block."""
        token_rope = self.rope.at(layout.boxes, layout.grid_size)
        half = token_rope.shape[-1] // 2
        identity = torch.cat([token_rope.new_zeros(half), token_rope.new_ones(half)])
        shape = (*token_rope.shape[:-2], seq.total, token_rope.shape[-1])
        return identity.expand(shape).clone().index_copy(-2, token_rows, token_rope)

    def pool(self, features: PackedFeatures) -> Tensor:
        """``(B, D)``: the model's pooling of each image's own tokens, as its ``forward_head`` pools the
        uniform grid (class token, mean, max, or an attention pool such as SigLIP's ``map``)."""
        m = self.model
        attention = getattr(m, "attn_pool", None) is not None
        if not attention and m.global_pool == "token":
            return features.prefix[:, 0]
        if attention or includes_prefix(m, attention):  # padded per image: the pool never mixes images
            x, valid = features.padded()
            return pool_padded(m, x, valid, self.num_prefix_tokens)
        pool = m.global_pool
        if pool == "avg":
            return features.layout.pool(features.tokens)
        if pool in ("max", "avgmax"):
            idx = features.layout.image_index[:, None].expand_as(features.tokens)
            peak = features.tokens.new_full(
                (features.layout.batch_size, features.tokens.shape[1]), float("-inf")
            )
            peak = peak.scatter_reduce(0, idx, features.tokens, reduce="amax")
            return peak if pool == "max" else 0.5 * (peak + features.layout.pool(features.tokens))
        raise ValueError(
            f"global_pool={pool!r} gives no vector per image (expected token, avg, max, avgmax or map)"
        )

    def forward_head(self, features: PackedFeatures, pre_logits: bool = False) -> Tensor:
        """timm's head on packed features: pooling as the model's own (`pool`), ``fc_norm``, ``head``;
        DeiT distilled averages its two heads at inference as timm does."""
        pooled = None if hasattr(self.model, "head_dist") else self.pool(features)
        return classifier(self.model, pooled, features.prefix, pre_logits, self.training)

    def _resolve_indices(self, indices: int | Sequence[int] | None) -> set[int]:
        if indices is None:
            return set()
        depth = self.depth
        chosen = (
            list(range(depth - indices, depth)) if isinstance(indices, int) else [i % depth for i in indices]
        )
        if any(i < 0 or i >= depth for i in chosen):
            raise ValueError(f"indices={indices} out of range for a {depth}-block model")
        return set(chosen)

    def _prefix_rows(self, seq: PackedSequence, device: torch.device) -> Tensor:
        starts = seq.cu_seqlens[:-1].long()
        return (starts[:, None] + torch.arange(self.num_prefix_tokens, device=device)).reshape(-1)
