"""Every packed-attention backend on this machine agrees with the block-diagonal reference."""

from __future__ import annotations

import pytest
import torch

from splitlab.backbone import BACKENDS, PackedSequence, available_backends, resolve_backend

LENGTHS = [(7,), (5, 17, 1, 9), (16, 16, 16), (33, 2)]


def run(backend_name: str, lengths, q, k, v):
    seq = PackedSequence.build(list(lengths), q.device, BACKENDS[backend_name])
    return seq.attend(q, k, v, scale=0.3)


@pytest.mark.parametrize("backend", [b for b in available_backends("cpu") if b != "dense"])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_backend_matches_reference(backend, lengths) -> None:
    total = sum(lengths)
    q, k, v = (torch.randn(total, 3, 16, requires_grad=True) for _ in range(3))
    ref = run("dense", lengths, q, k, v)
    if backend == "flex":  # flex_attention has no CPU backward (torch 2.14): forward only
        with torch.no_grad():
            assert (run(backend, lengths, q, k, v) - ref).abs().max().item() <= 1e-5
        return
    out = run(backend, lengths, q, k, v)
    assert (out - ref).abs().max().item() <= 1e-5
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for g, gr in zip(grads, grads_ref, strict=True):
        assert (g - gr).abs().max().item() <= 1e-4


def test_reference_is_per_image_attention() -> None:
    lengths = (4, 6)
    q, k, v = (torch.randn(10, 2, 8) for _ in range(3))
    out = run("dense", lengths, q, k, v)
    for s, e in ((0, 4), (4, 10)):
        scores = torch.einsum("qhd,khd->hqk", q[s:e], k[s:e]) * 0.3
        want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[s:e])
        assert torch.allclose(out[s:e], want, atol=1e-6)


def test_auto_backend_and_refusals() -> None:
    assert resolve_backend("auto", "cpu").name == "padded"  # autograd records: training
    with torch.no_grad():
        assert resolve_backend("auto", "cpu").name == "per_image"  # inference
    with pytest.raises(ValueError, match="attn_backend='fast'"):
        resolve_backend("fast", "cpu")
    with pytest.raises(ValueError, match="attn_backend='flash' is not available"):
        resolve_backend("flash", "cpu")


@pytest.mark.parametrize("loads", [False, True], ids=["broken-wheel", "working"])
def test_flash_is_offered_only_when_it_imports(monkeypatch, loads) -> None:
    """A flash-attn wheel built for another torch is on disk but fails to import: ``auto`` must not
    pick it (every CUDA forward would fail), so availability is an import, not a file lookup."""
    import importlib.machinery
    import sys
    import types

    from splitlab.backbone import flash_attn_importable

    fake = types.ModuleType("flash_attn")
    fake.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    if loads:
        fake.flash_attn_varlen_func = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    flash_attn_importable.cache_clear()
    try:
        assert BACKENDS["flash"].available(torch.device("cuda"), torch.bfloat16) is loads
        assert not BACKENDS["flash"].available(torch.device("cuda"), torch.float32)
    finally:
        flash_attn_importable.cache_clear()
