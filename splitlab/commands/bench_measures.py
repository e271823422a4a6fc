"""What `splitlab bench` measures beside the interleaved timing: the instrumented pass's parts, token
and FLOP counts, throughput and its spread, and each path's memory, host syncs and page faults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from splitlab.backbone import backbone_flops
from splitlab.commands.allocator import minor_page_faults
from splitlab.metrics import pair_spread, synchronize, timed
from splitlab.model import SplitModel
from splitlab.model.predict import image_files
from splitlab.model.preprocess import Placement, Preprocessing
from splitlab.tokenizer import build_layout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_images(
    path: str, count: int, preprocessing: Preprocessing, img_size: int | None = None
) -> tuple[Tensor, list[Placement]]:
    """``count`` images of the folder (repeated if it has fewer), as the model preprocesses them (at
    ``img_size`` where ``--img-size`` asks for another side), and where each lies in the input."""
    from PIL import Image

    files = image_files([path])
    if not files:
        raise FileNotFoundError(f"--images {path}: no image files")
    if img_size is not None and preprocessing.img_size != img_size:
        preprocessing = dataclasses.replace(preprocessing, img_size=img_size)
    prepared = [preprocessing(Image.open(files[i % len(files)])) for i in range(count)]
    return torch.stack([image for image, _ in prepared]), [place for _, place in prepared]


def device_label(device: torch.device) -> str:
    """The device a bench ran on, as its tables name it (the GPU's name, or the CPU's threads)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def host_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Device-to-host synchronisations of one call (CUDA's sync debug mode counts them; None on CPU)."""
    if device.type != "cuda":
        return None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def page_faults(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Minor page faults of one call on CPU: fresh memory written for the first time (None on CUDA,
    where activations live in the caching allocator, and where the system does not count them)."""
    before = minor_page_faults() if device.type == "cpu" else None
    if before is None:
        return None
    fn()
    return minor_page_faults() - before


def peak_memory(fn: Callable[[], Any], device: torch.device) -> float | None:
    """MiB one batch adds at its peak over what was allocated before it (activations and
    workspace; weights and the input excluded, so that ``--compile``'s copy of the uniform model
    counts against neither path)."""
    if device.type != "cuda":
        return None  # no per-path peak on CPU without an allocator hook; reported on CUDA
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


@torch.inference_mode()
def breakdown(model: SplitModel, images: Tensor, iters: int, device: torch.device) -> dict[str, float]:
    """Seconds per batch in embed / decide / walk / backbone: the deployed path's steps one by one
    (instrumented pass, syncs between parts); and ``patch_embed``, the finest level's patch
    embedding alone: part of embed, and work timm's uniform forward does too."""
    parts = dict.fromkeys(("patch_embed", "embed", "decide", "walk", "backbone"), 0.0)
    tokenizer, backbone = model.tokenizer, model.backbone
    for _ in range(iters):
        with timed(device) as patch_embed:
            backbone.embed_patches(images)
        with timed(device) as embed:
            tokens, _ = tokenizer.embed(images, backbone)
        with timed(device) as decide:
            decisions, logits = tokenizer.decide(
                tokens, "threshold", budget=model.budget, max_tokens=model.max_tokens
            )
        with timed(device) as walk:
            layout = build_layout(tokens, decisions, tokenizer.levels, logits)
        with timed(device) as run_backbone:
            backbone.forward_head(backbone(layout))
        for key, elapsed in zip(parts, (patch_embed, embed, decide, walk, run_backbone), strict=True):
            parts[key] += elapsed() / iters
    return parts


def speeds(times_uniform: Sequence[float], times_split: Sequence[float], batch_size: int) -> dict[str, Any]:
    """Throughput, speed-up (with the spread of its timed pairs) and latency of the interleaved passes."""
    t_uniform, t_split = sum(times_uniform), sum(times_split)
    images_done = batch_size * len(times_uniform)
    return {
        "throughput_uniform": images_done / t_uniform,
        "throughput_split": images_done / t_split,
        "speedup": t_uniform / t_split,
        "speedup_spread": pair_spread(times_uniform, times_split),
        "latency_ms_per_image_uniform": 1e3 * t_uniform / images_done,
        "latency_ms_per_image_split": 1e3 * t_split / images_done,
    }


def token_costs(model: SplitModel, layout: Any, batch_size: int) -> dict[str, Any]:
    """Tokens and backbone FLOPs of the uniform grid and of the deployed layout, and their ratio (the
    ideal speed-up)."""
    backbone = model.backbone
    prefix = backbone.num_prefix_tokens
    finest = layout.grid_size[0] * layout.grid_size[1]
    flops_uniform = backbone_flops(backbone.model, [finest + prefix] * batch_size)
    flops_split = backbone_flops(backbone.model, [n + prefix for n in layout.seqlens])
    return {
        "ideal_speedup": flops_uniform / flops_split,
        "token_fraction": float(layout.fraction.mean()),
        "tokens_uniform": finest,
        "tokens_split_mean": sum(layout.seqlens) / len(layout.seqlens),
        "gflops_uniform_per_image": flops_uniform / batch_size / 1e9,
        "gflops_split_per_image": flops_split / batch_size / 1e9,
    }


def overheads(parts: dict[str, float]) -> dict[str, Any]:
    """The instrumented pass's parts in ms, and what the tokenizer costs against the backbone."""
    return {
        "time_ms": {k: v * 1e3 for k, v in parts.items()},
        "overhead_fraction": (parts["embed"] + parts["decide"] + parts["walk"]) / parts["backbone"],
        # what SPLIT runs beyond the uniform forward: its own patch embedding is work timm does too
        "overhead_beyond_uniform_fraction": (
            parts["embed"] - parts["patch_embed"] + parts["decide"] + parts["walk"]
        )
        / parts["backbone"],
    }


def resources(
    run_uniform: Callable[[], Any], run_split: Callable[[], Any], device: torch.device
) -> dict[str, Any]:
    """Peak memory, host syncs and page faults of one batch of each path (None where not measured)."""
    return {
        "peak_memory_mib_uniform": peak_memory(run_uniform, device),
        "peak_memory_mib_split": peak_memory(run_split, device),
        "host_syncs_per_batch": host_syncs(run_split, device),
        "page_faults_per_batch_uniform": page_faults(run_uniform, device),
        "page_faults_per_batch_split": page_faults(run_split, device),
    }
