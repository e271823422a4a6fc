"""Attention over packed variable-length sequences, behind one interface.

A packed batch is one long sequence ``(T, H, d)`` in which image ``i`` owns the rows
``cu_seqlens[i]:cu_seqlens[i + 1]``; attention must not cross those boundaries. Backends:

- ``dense``: SDPA over the whole sequence with a block-diagonal mask. The reference: obviously
  right, runs everywhere, costs O(T^2) memory.
- ``padded``: scatter to ``(B, H, L_max, d)`` with a key mask, SDPA, gather back. Only attention
  sees the padding (the linear layers stay packed); the fastest correct choice on CPU.
- ``per_image``: SDPA on each image's rows without a mask: on CPU a mask sends SDPA to its slow
  math path, and the cost then follows each image's own length.
- ``nested``: SDPA on jagged nested tensors; on CUDA this dispatches to varlen flash or
  memory-efficient kernels without padding.
- ``flex``: compiled ``flex_attention`` with a document block mask built once per batch.
- ``flash``: ``flash_attn.flash_attn_varlen_func`` when the package imports (CUDA, fp16/bf16).

``auto`` picks ``flash`` > ``nested`` on CUDA; on CPU ``per_image`` where autograd is off and
``padded`` where it records (see `resolve_backend`; earlier, 8 images of ~140 tokens, ViT-B heads:
padded 6.7 ms, flex compiled 16.5 ms, dense 26.6 ms, nested 58 ms per layer).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class PackedSequence:
    """Image boundaries of a packed sequence, passed to every attention layer as its ``attn_mask``.

    Attributes:
        cu_seqlens: ``(B + 1,)`` int32 offsets on the device (prefix tokens included).
        seqlens: host copy of the per-image lengths.
        backend: the attention backend that serves this batch.
        state: what the backend precomputed once for the batch (indices, masks).
    """

    cu_seqlens: Tensor
    seqlens: tuple[int, ...]
    backend: AttentionBackend
    state: Any = field(default=None, repr=False)

    @property
    def max_seqlen(self) -> int:
        return max(self.seqlens)

    @property
    def total(self) -> int:
        return sum(self.seqlens)

    @classmethod
    def build(
        cls, seqlens: list[int] | tuple[int, ...], device: torch.device, backend: AttentionBackend
    ) -> PackedSequence:
        """Offsets and backend state for images of ``seqlens`` tokens (no device sync)."""
        lengths = torch.tensor(seqlens, dtype=torch.int32)
        cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)).to(device, non_blocking=True)
        seq = cls(cu_seqlens=cu, seqlens=tuple(int(s) for s in seqlens), backend=backend)
        seq.state = backend.prepare(seq)
        return seq

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, dropout_p: float = 0.0
    ) -> Tensor:
        """``(T, H, d)`` q, k, v -> ``(T, H, d)`` per-image attention output."""
        return self.backend.attend(q, k, v, self, scale, dropout_p)


class AttentionBackend:
    """One way of computing attention over a packed sequence."""

    name = "base"

    def available(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether this backend can run for tensors on ``device`` of ``dtype``."""
        return True

    def prepare(self, seq: PackedSequence) -> Any:
        """Precompute what every layer of the batch shares."""
        return None

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, seq: PackedSequence, scale: float | None, dropout_p: float
    ) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _image_ids(seq: PackedSequence) -> Tensor:
    """The image of every packed token, from the offsets already on the device (no copy, no sync)."""
    lengths = seq.cu_seqlens.diff()
    return torch.repeat_interleave(
        torch.arange(len(seq.seqlens), device=lengths.device), lengths, output_size=seq.total
    )


class DenseMaskBackend(AttentionBackend):
    """Reference: one SDPA call over the whole sequence with a block-diagonal mask."""

    name = "dense"

    def prepare(self, seq: PackedSequence) -> Tensor:
        ids = _image_ids(seq)
        return ids[:, None] == ids[None, :]

    def attend(self, q, k, v, seq, scale, dropout_p):
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=seq.state,
            dropout_p=dropout_p,
            scale=scale,
        )
        return out[0].transpose(0, 1)


@dataclass
class _PadState:
    index: Tensor  # (T,) row of each token in the (B * L) padded layout
    key_mask: Tensor  # (B, 1, 1, L) True where a key exists
    batch: int
    length: int


class PaddedBackend(AttentionBackend):
    """Pad to the longest image for attention only, with a key mask; everything else stays packed."""

    name = "padded"

    def prepare(self, seq: PackedSequence) -> _PadState:
        ids = _image_ids(seq)
        length = seq.max_seqlen
        position = torch.arange(seq.total, device=ids.device) - seq.cu_seqlens.long()[ids]
        index = ids * length + position
        valid = torch.zeros(len(seq.seqlens) * length, dtype=torch.bool, device=ids.device)
        valid[index] = True
        return _PadState(index, valid.view(-1, 1, 1, length), len(seq.seqlens), length)

    def attend(self, q, k, v, seq, scale, dropout_p):
        st: _PadState = seq.state
        heads, dim = q.shape[1], q.shape[2]

        def pad(x: Tensor) -> Tensor:
            out = x.new_zeros(st.batch * st.length, heads, dim).index_copy(0, st.index, x)
            return out.view(st.batch, st.length, heads, dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            pad(q), pad(k), pad(v), attn_mask=st.key_mask, dropout_p=dropout_p, scale=scale
        )
        return out.transpose(1, 2).reshape(st.batch * st.length, heads, v.shape[2]).index_select(0, st.index)


class PerImageBackend(AttentionBackend):
    """SDPA on each image's own rows, without a mask: the cost follows each image's own length.

    On CPU a mask sends SDPA to its math path, and padding to the longest image pays for tokens that
    are not there: measured on 2 cores, ViT-B heads, 32 images at f ~ 0.7, one attention call took
    255 ms padded with a key mask, 121 ms padded without one, 75 ms per image, 104 ms for the
    uniform grid. One call per image costs a launch each, which the CPU pays in microseconds (on
    CUDA the varlen kernels do the same in one call: ``flash``, ``nested``).
    """

    name = "per_image"

    def prepare(self, seq: PackedSequence) -> list[tuple[int, int]]:
        starts = [0]
        for length in seq.seqlens:
            starts.append(starts[-1] + length)
        return list(zip(starts[:-1], starts[1:], strict=True))

    def attend(self, q, k, v, seq, scale, dropout_p):
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
        for start, end in seq.state:
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),
                k[start:end].transpose(0, 1),
                v[start:end].transpose(0, 1),
                dropout_p=dropout_p,
                scale=scale,
            ).transpose(0, 1)
        return out


class NestedBackend(AttentionBackend):
    """SDPA on jagged nested tensors: varlen kernels on CUDA, no padding."""

    name = "nested"

    def prepare(self, seq: PackedSequence) -> dict[str, Any]:
        return {"offsets": seq.cu_seqlens.long(), "min": min(seq.seqlens), "max": seq.max_seqlen}

    def attend(self, q, k, v, seq, scale, dropout_p):
        st = seq.state

        def nest(x: Tensor) -> Tensor:
            # contiguous: on a CPU-only host, strided views send SDPA's backend check into CUDA (torch 2.14)
            nt = torch.nested.nested_tensor_from_jagged(
                x.contiguous(), st["offsets"], min_seqlen=st["min"], max_seqlen=st["max"]
            )
            return nt.transpose(1, 2)

        out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), dropout_p=dropout_p, scale=scale)
        return out.transpose(1, 2).values()


class FlexBackend(AttentionBackend):
    """Compiled ``flex_attention`` with a document block mask (lengths bucketed to limit recompiles).

    For experiments, not the fast path (``auto`` never picks it): the block mask is built eagerly,
    which materialises a padded x padded boolean mask (ViT-L/14-336 at batch 128 and f = 0.7: about
    52k tokens, 2.7 GB), and each new 128-token bucket compiles once more (torch gives up compiling
    after 8 and runs it eagerly)."""

    name = "flex"
    bucket = 128
    _compiled = None

    def available(self, device, dtype):
        return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None

    def prepare(self, seq: PackedSequence) -> dict[str, Any]:
        from torch.nn.attention.flex_attention import create_block_mask

        total = seq.total
        padded = -(-total // self.bucket) * self.bucket
        ids = torch.full((padded,), -1, dtype=torch.long, device=seq.cu_seqlens.device)
        ids[:total] = _image_ids(seq)

        def same_image(b, h, q_idx, kv_idx):
            return (ids[q_idx] == ids[kv_idx]) & (ids[q_idx] >= 0)

        mask = create_block_mask(same_image, None, None, padded, padded, device=ids.device)
        return {"mask": mask, "padded": padded}

    @classmethod
    def _flex(cls):
        if cls._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            cls._compiled = torch.compile(flex_attention, dynamic=False)
        return cls._compiled

    def attend(self, q, k, v, seq, scale, dropout_p):
        if dropout_p:
            raise ValueError("the flex attention backend does not support attention dropout")
        st = seq.state
        extra = st["padded"] - q.shape[0]

        def prep(x: Tensor) -> Tensor:
            return F.pad(x, (0, 0, 0, 0, 0, extra)).transpose(0, 1)[None]

        out = self._flex()(prep(q), prep(k), prep(v), block_mask=st["mask"], scale=scale)
        return out[0].transpose(0, 1)[: q.shape[0]]


@functools.cache
def flash_attn_importable() -> bool:
    """Whether flash-attn's varlen kernel imports here (checked once per process).

    A package on disk is not enough: flash-attn wheels are built against one torch version, and
    one built for another fails at import ("undefined symbol"). ``auto`` must then pick the next
    backend rather than fail every CUDA forward.
    """
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


class FlashVarlenBackend(AttentionBackend):
    """``flash_attn_varlen_func`` from the flash-attn package (CUDA, fp16/bf16)."""

    name = "flash"

    def available(self, device, dtype):
        return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_attn_importable()

    def attend(self, q, k, v, seq, scale, dropout_p):
        from flash_attn import flash_attn_varlen_func

        cu, length = seq.cu_seqlens, seq.max_seqlen
        return flash_attn_varlen_func(
            q, k, v, cu, cu, length, length, dropout_p=dropout_p, softmax_scale=scale
        )


BACKENDS: dict[str, AttentionBackend] = {
    b.name: b
    for b in (
        DenseMaskBackend(),
        PaddedBackend(),
        PerImageBackend(),
        NestedBackend(),
        FlexBackend(),
        FlashVarlenBackend(),
    )
}


def available_backends(device: torch.device | str, dtype: torch.dtype = torch.float32) -> list[str]:
    """Names of the backends that can run on ``device`` with ``dtype``."""
    device = torch.device(device)
    return [name for name, b in BACKENDS.items() if b.available(device, dtype)]


def check_backend_name(name: str) -> str:
    """``name`` if it is ``auto`` or a registered backend, else a ValueError naming the setting."""
    if name != "auto" and name not in BACKENDS:
        raise ValueError(f"attn_backend={name!r}: expected 'auto' or one of {sorted(BACKENDS)}")
    return name


def resolve_backend(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> AttentionBackend:
    """The backend called ``name``, or for ``auto`` the fastest correct one for ``device`` and ``dtype``."""
    device = torch.device(device)
    check_backend_name(name)
    if name == "auto":
        # CPU, measured on 2 cores (docs/performance.md): without autograd (inference, evaluation,
        # PPO's rollouts) SDPA per image without a mask is fastest at every size (ViT-B, 32 images:
        # 23 ms against 76 ms padded; the twins' 4 heads of 32: 1.6 against 5.8 ms); with autograd
        # the masked padded call's backward beats a loop of small ones on short sequences (the
        # twins' training step: 6.7 against 9.7 ms) and ties at ViT-B size
        cpu = ("per_image",) if not torch.is_grad_enabled() else ("padded",)
        order = ("flash", "nested", "padded") if device.type == "cuda" else cpu
        name = next(n for n in order if BACKENDS[n].available(device, dtype))
    backend = BACKENDS[name]
    if not backend.available(device, dtype):
        raise ValueError(f"attn_backend={name!r} is not available for {device.type} tensors of {dtype}")
    return backend
