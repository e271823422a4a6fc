"""`PackedViT`: a timm VisionTransformer run on packed mixed-resolution token sequences."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from timm.layers import Attention, apply_rot_embed_cat, resample_abs_pos_embed
from timm.models.eva import Eva, EvaAttention
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from splitlab.backbone.attention import PackedSequence, check_backend_name, resolve_backend
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
        dropout = self.attn_drop.p if self.training else 0.0
        out = seq.attend(q, k, v, scale=self.scale, dropout_p=dropout)
        out = self.norm(out.reshape(batch, total, self.num_heads * self.head_dim))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


class PackedEvaAttention(EvaAttention):
    """timm's `EvaAttention` on a packed sequence: rotary embedding given per token (prefix rows are identity)."""

    def forward(
        self, x: Tensor, rope: Tensor | None = None, attn_mask=None, is_causal: bool = False
    ) -> Tensor:  # type: ignore[override]
        if not isinstance(attn_mask, PackedSequence):
            return super().forward(x, rope=rope, attn_mask=attn_mask, is_causal=is_causal)
        seq = attn_mask
        batch, total, channels = x.shape
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        rows = batch * total
        if self.qkv is not None:
            if self.q_bias is None:
                qkv = self.qkv(x)
            else:
                qkv = torch.nn.functional.linear(
                    x, self.qkv.weight, torch.cat((self.q_bias, self.k_bias, self.v_bias))
                )
            q, k, v = qkv.view(rows, 3, self.num_heads, -1).unbind(1)
        else:
            q = self.q_proj(x).view(rows, self.num_heads, -1)
            k = self.k_proj(x).view(rows, self.num_heads, -1)
            v = self.v_proj(x).view(rows, self.num_heads, -1)
        q, k = self.q_norm(q).type_as(v), self.k_norm(k).type_as(v)  # as above
        if rope is not None:
            q = apply_rot_embed_cat(q, rope[:, None, :]).type_as(v)
            k = apply_rot_embed_cat(k, rope[:, None, :]).type_as(v)
        dropout = self.attn_drop.p if self.training else 0.0
        out = self.norm(seq.attend(q, k, v, scale=self.scale, dropout_p=dropout).reshape(batch, total, -1))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


PATCHED = {Attention: PackedAttention, EvaAttention: PackedEvaAttention}


def rope_at(rope: nn.Module, centres: Tensor, grid: tuple[int, int]) -> Tensor:
    """Rotary embedding of timm's `RotaryEmbeddingCat` at arbitrary (y, x) positions in finest cells.

    The embedding is linear in position before sin/cos, so a coarse token gets the rotation of
    the centre of the cells it covers, in the same coordinates as the model's own grid.
    """
    c = centres.float() + rope.grid_offset
    if rope.ref_feat_shape is not None:  # per-axis Python scalars: no host-to-device copy (a sync)
        ref = rope.ref_feat_shape
        c = torch.stack([c[..., 0] / grid[0] * ref[0], c[..., 1] / grid[1] * ref[1]], -1)
    angles = (c[..., None] * rope.bands.to(c.device)).flatten(-2)
    return torch.cat([angles.sin().repeat_interleave(2, -1), angles.cos().repeat_interleave(2, -1)], -1)


def _check_rope(model: nn.Module, name: str) -> None:
    """Refuse rotary-embedding variants `rope_at` does not reproduce (checked against the model itself)."""
    rope = getattr(model, "rope", None)
    if rope is None:
        return
    if getattr(model, "rope_mixed", False) or type(rope).__name__ != "RotaryEmbeddingCat":
        raise ValueError(
            f"model_name={name!r}: its rotary embedding ({type(rope).__name__}) is not supported on packed sequences"
        )
    grid = tuple(model.patch_embed.grid_size)
    ys, xs = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    mine = rope_at(rope, torch.stack([ys, xs], -1).reshape(-1, 2), grid)
    theirs = rope.get_embed()
    if (
        rope.in_pixels
        or rope.rotate_half
        or theirs.shape != mine.shape
        or (theirs.float() - mine).abs().max() > 1e-4
    ):
        raise ValueError(
            f"model_name={name!r}: its rotary embedding variant is not supported on packed sequences"
        )


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


def create_vit(model_name: str, pretrained: bool = False, checkpoint_path: str = "", **kwargs) -> nn.Module:
    """``timm.create_model`` with errors that name the setting.

    With ``pretrained`` and local weights (``checkpoint_path``), the file takes the download's
    place and goes through timm's pretrained loader, which adapts position and patch embeddings to
    the model's size (the dense recipes run EVA-02 at /16 and 1024 px). timm's own
    ``checkpoint_path`` would fetch the pretrained weights first (fails offline) and then load the
    file strictly (fails at another size).
    """
    if not timm.is_model(model_name):
        close = timm.list_models(f"*{model_name.split('.')[0][:12]}*")[:5]
        hint = f" (close: {', '.join(close)})" if close else ""
        raise ValueError(f"model_name={model_name!r} is not a timm model{hint}")
    if checkpoint_path and not Path(checkpoint_path).is_file():
        raise FileNotFoundError(
            f"checkpoint_path={checkpoint_path}: no such file (the backbone's local weights)"
        )
    if pretrained and checkpoint_path:
        overlay = {**kwargs.pop("pretrained_cfg_overlay", {}), "file": checkpoint_path, "source": ""}
        return timm.create_model(model_name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    try:
        return timm.create_model(model_name, pretrained=pretrained, checkpoint_path=checkpoint_path, **kwargs)
    except OSError as err:  # the hub unreachable (or offline) and no cached copy: name the ways out
        if not pretrained:
            raise
        raise OSError(
            f"model_name={model_name!r}: its pretrained weights could not be loaded ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:160]}); on a machine without the hub set model.init_args.checkpoint_path "
            "to a local weights file, or fill the Hugging Face cache elsewhere and set HF_HUB_OFFLINE=1"
        ) from err


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
        if not isinstance(model, VisionTransformer | Eva):
            raise ValueError(
                f"model_name={name!r} builds a timm {type(model).__name__}, but PackedViT needs a "
                "VisionTransformer or an Eva (EVA-02) model"
            )
        _check_rope(model, name)
        self.model = model
        self.attn_backend = attn_backend
        # Inference-only cache of resampled position embeddings (pos_embed_grid): the bicubic
        # resample of a coarse grid costs as much as the quadtree walk at batch 1.
        self._resampled: dict[tuple[Any, ...], Tensor] = {}
        self._patch_attention(name)

    def _patch_attention(self, name: str) -> None:
        for block in self.model.blocks:
            if "attn_mask" not in inspect.signature(block.forward).parameters:
                raise ValueError(
                    f"model_name={name!r}: its block type {type(block).__name__} takes no attn_mask, "
                    "so packed attention cannot reach it (timm >= 1.0.20 blocks do)"
                )
            attn = getattr(block, "attn", None)
            if type(attn) in PATCHED:
                attn.__class__ = PATCHED[type(attn)]
            elif not isinstance(attn, tuple(PATCHED.values())):
                raise ValueError(
                    f"model_name={name!r}: attention type {type(attn).__name__} is not timm's Attention or "
                    "EvaAttention, which PackedViT supports"
                )

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
        """``(B, C, h*p, w*p)`` -> ``(B, h, w, D)`` with the model's patch embedding (any size)."""
        pe = self.model.patch_embed
        x = pe.proj(images).permute(0, 2, 3, 1)
        return pe.norm(x)

    def pos_embed_grid(self, grid: tuple[int, int]) -> Tensor | None:
        """``(h, w, D)`` position embedding of a ``grid``, resampled (bicubic) from the model's grid."""
        pos = self.model.pos_embed
        if pos is None:
            return None
        skip = 0 if self.model.no_embed_class else self.num_prefix_tokens
        patch_pos = pos[:, skip:]
        old = tuple(self.model.patch_embed.grid_size)
        if tuple(grid) == old:
            return patch_pos.view(grid[0], grid[1], -1)
        # Computed once per weights under inference mode (an in-place update of the embedding bumps
        # its version, so a changed embedding is a new key); never while autograd, a compiler or export traces.
        tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        cacheable = torch.is_inference_mode_enabled() and not tracing
        key = (tuple(grid), pos._version, pos.data_ptr(), pos.device, pos.dtype) if cacheable else None
        if key in self._resampled:
            return self._resampled[key]
        patch_pos = resample_abs_pos_embed(
            patch_pos, new_size=list(grid), old_size=list(old), num_prefix_tokens=0
        )
        patch_pos = patch_pos.view(grid[0], grid[1], -1)
        if key is not None:
            if len(self._resampled) >= 16:  # keys of earlier weights or devices
                self._resampled.clear()
            self._resampled[key] = patch_pos
        return patch_pos

    def prefix_tokens(self, batch: int) -> Tensor:
        """``(B, P, D)`` CLS and register tokens with their position embedding, as timm adds it."""
        m = self.model
        parts = [t.expand(batch, -1, -1) for t in (m.cls_token, m.reg_token) if t is not None]
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
        return x[None], seq, token_rows

    def forward(self, layout: TokenLayout, indices: int | Sequence[int] | None = None) -> PackedFeatures:
        """Run the blocks on a layout.

        Args:
            layout: tokens from `splitlab.tokenizer.SplitTokenizer` (with this model's embeddings).
            indices: blocks whose outputs to return too: the last ``n`` if an int, else block indices.
        """
        take = self._resolve_indices(indices)
        x, seq, token_rows = self.pack(layout)
        extra = (
            {"rope": self.packed_rope(layout, seq, token_rows)}
            if getattr(self.model, "rope", None) is not None
            else {}
        )
        x = self.model.norm_pre(x)
        intermediates = []
        for i, block in enumerate(self.model.blocks):
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
        """Per-row rotary embedding of the packed sequence: each token at the centre of its cells,
        CLS and register rows the identity rotation (sin 0, cos 1), as timm leaves prefix tokens."""
        boxes = layout.boxes.float()
        centres = torch.stack([(boxes[:, 1] + boxes[:, 3] - 1) / 2, (boxes[:, 0] + boxes[:, 2] - 1) / 2], -1)
        token_rope = rope_at(self.model.rope, centres, layout.grid_size)
        half = token_rope.shape[-1] // 2
        identity = torch.cat([token_rope.new_zeros(half), token_rope.new_ones(half)])
        rope = identity.expand(seq.total, -1).index_copy(0, token_rows, token_rope)
        return rope

    def forward_head(self, features: PackedFeatures, pre_logits: bool = False) -> Tensor:
        """timm's head on packed features: pooling as the model's ``global_pool``, ``fc_norm``, ``head``."""
        m = self.model
        pool = m.global_pool
        if pool == "token":
            x = features.prefix[:, 0]
        elif pool == "avg":
            x = features.layout.pool(features.tokens)
        elif pool in ("max", "avgmax"):
            idx = features.layout.image_index[:, None].expand_as(features.tokens)
            peak = features.tokens.new_full(
                (features.layout.batch_size, features.tokens.shape[1]), float("-inf")
            )
            peak = peak.scatter_reduce(0, idx, features.tokens, reduce="amax")
            x = peak if pool == "max" else 0.5 * (peak + features.layout.pool(features.tokens))
        else:
            raise ValueError(f"global_pool={pool!r} is not supported on packed features")
        x = m.head_drop(m.fc_norm(x))
        return x if pre_logits else m.head(x)

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
