"""`splitlab bench`: SPLIT's throughput against timm's uniform grid, on the same batch, in one process.

Method (as ToMe measures): warm up and discard, then interleave the two paths iteration by
iteration, synchronising CUDA before every clock read. The SPLIT path is end to end: multi-scale
embedding, decisions, quadtree walk, packed backbone and head. A separate instrumented pass times
each part (embed / decide / walk / backbone). The ideal speed-up counts backbone FLOPs of the
uniform and the packed sequences (linear layers grow with N, attention with N² per image).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from splitlab.backbone import PackedViT, backbone_flops
from splitlab.commands.arguments import count, device_name, fraction, output_file, positive_int
from splitlab.report import format_bench
from splitlab.tokenizer import Levels, SplitTokenizer, build_layout, calibrate_threshold

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BenchConfig:
    """What to measure (see ``splitlab bench --help``)."""

    model: str = "vit_base_patch16_224"
    img_size: int | None = None
    batch_size: int = 8
    dtype: str = "float32"
    device: str = "cpu"
    levels: Sequence[int] | None = None
    ckpt: str | None = None
    fraction: float | None = 0.7
    images: str | None = None
    warmup: int = 2
    iters: int = 5
    attn_backend: str = "auto"
    compile: bool = False
    seed: int = 0
    lm: str | None = None
    patch_size: int | None = None


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load_images(path: str, count: int, size: int, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    from PIL import Image
    from timm.data import create_transform

    files = sorted(p for p in Path(path).rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
    if not files:
        raise FileNotFoundError(f"--images {path}: no .png/.jpg/.jpeg/.webp files")
    transform = create_transform(input_size=(3, size, size), crop_pct=1.0, mean=mean, std=std)
    batch = [transform(Image.open(files[i % len(files)]).convert("RGB")) for i in range(count)]
    return torch.stack(batch)


@dataclass
class SplitPath:
    """The deployed SPLIT path: the tokenizer at its budget (and hard cap), the packed backbone, the head."""

    tokenizer: SplitTokenizer
    backbone: PackedViT
    budget: float | None = None
    max_tokens: int | None = None
    normalisation: tuple[Any, Any] | None = None  # a checkpoint's data mean / std (else the backbone's)

    def layout(self, images: Tensor) -> Any:
        return self.tokenizer(
            images, self.backbone, "threshold", budget=self.budget, max_tokens=self.max_tokens
        )

    def __call__(self, images: Tensor) -> Tensor:
        return self.backbone.forward_head(self.backbone(self.layout(images)))


def build(cfg: BenchConfig, device: torch.device) -> SplitPath:
    """The SPLIT path: from a SPLIT checkpoint (its budget and cap), or fresh (random init) around a timm model."""
    if cfg.ckpt:
        from splitlab.tasks import load_task, read_checkpoint

        task = load_task(cfg.ckpt, map_location="cpu", setting="--ckpt")
        if task.deployed_policy != "learned":  # bench times the decision module; this run does not deploy it
            raise ValueError(
                f"--ckpt {cfg.ckpt}: this run deploys policy {task.deployed_policy!r}, not a learned one, so "
                "its decision module was never trained; bench the same model at the same budget with "
                f"--fraction {task.target_fraction:g} (a calibrated layout) instead"
            )
        task.backbone.attn_backend = cfg.attn_backend
        data = read_checkpoint(cfg.ckpt, "--ckpt", weights_only=False, mmap=True).get(
            "datamodule_hyper_parameters", {}
        )
        normalisation = (data["mean"], data["std"]) if "mean" in data and "std" in data else None
        path = SplitPath(task.tokenizer, task.backbone, task.target_fraction, task.max_tokens, normalisation)
    else:
        kwargs: dict[str, Any] = {"img_size": cfg.img_size} if cfg.img_size else {}
        if cfg.patch_size:  # e.g. EVA-02 converted to /16, as the dense recipes use it
            kwargs["patch_size"] = cfg.patch_size
        backbone = PackedViT(cfg.model, attn_backend=cfg.attn_backend, **kwargs)
        levels = (
            Levels.build(cfg.levels, backbone.patch_size)
            if cfg.levels
            else Levels.default(backbone.patch_size, backbone.img_size)
        )
        levels.check_image(backbone.img_size)
        path = SplitPath(SplitTokenizer(backbone.embed_dim, levels), backbone)
    path.backbone.to(device).eval()
    path.tokenizer.to(device).eval()
    return path


@torch.inference_mode()
def calibrate_policy(path: SplitPath, images: Tensor, fraction: float) -> float:
    """Set the policy's cut so that deployment (threshold mode) meets ``fraction`` on ``images``.

    The cut replaces every operating point of the loaded policy for this measurement, so the
    split path runs exactly as deployed, at a known token count. Returns the logit cut.
    """
    tokenizer = path.tokenizer
    tokenizer.levels.check_fraction(fraction, "--fraction")
    tokens, _ = tokenizer.embed(images, path.backbone)
    cut = calibrate_threshold(tokenizer.decision_logits(tokens, path.budget), fraction)
    for point in range(len(tokenizer.operating_points.budgets)):
        tokenizer.operating_points.set(point, cut)
    return cut


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _interleaved(
    run_uniform: Callable[[], Any],
    run_split: Callable[[], Any],
    warmup: int,
    iters: int,
    device: torch.device,
) -> tuple[float, float]:
    """Total seconds of ``iters`` calls of each path, after ``warmup`` discarded ones, the two paths
    alternating so that drifts of a shared machine hit both alike."""
    for _ in range(warmup):
        run_uniform()
        run_split()
    t_uniform = t_split = 0.0
    for _ in range(iters):
        t_uniform += _timed(run_uniform, device)
        t_split += _timed(run_split, device)
    return t_uniform, t_split


def _host_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
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


def _peak_memory(fn: Callable[[], Any], device: torch.device) -> float | None:
    """MiB one batch adds at its peak over what was allocated before it (activations and
    workspace; weights and the input excluded, so that ``--compile``'s copy of the uniform model
    counts against neither path)."""
    if device.type != "cuda":
        return None  # no per-path peak on CPU without an allocator hook; reported on CUDA
    _sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


@torch.inference_mode()
def breakdown(path: SplitPath, images: Tensor, iters: int, device: torch.device) -> dict[str, float]:
    """Seconds per batch in embed / decide / walk / backbone (instrumented pass, syncs between parts)."""
    parts = dict.fromkeys(("embed", "decide", "walk", "backbone"), 0.0)
    tokenizer, backbone = path.tokenizer, path.backbone
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        tokens, _ = tokenizer.embed(images, backbone)
        _sync(device)
        t1 = time.perf_counter()
        decisions, logits = tokenizer.decide(
            tokens, "threshold", budget=path.budget, max_tokens=path.max_tokens
        )
        _sync(device)
        t2 = time.perf_counter()
        layout = build_layout(tokens, decisions, tokenizer.levels, logits)
        _sync(device)
        t3 = time.perf_counter()
        backbone.forward_head(backbone(layout))
        _sync(device)
        t4 = time.perf_counter()
        for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            parts[key] += dt / iters
    return parts


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Measure and return the table's numbers (see the module docstring)."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"--dtype {cfg.dtype}: expected one of {sorted(DTYPES)}")
    if cfg.ckpt is None and cfg.fraction is None:
        raise ValueError("give --ckpt (a trained SPLIT checkpoint) or --fraction (a calibrated layout)")
    if cfg.compile and cfg.warmup < 1:
        raise ValueError("--compile with --warmup 0 would time the compilation: give --warmup 1 or more")
    device = _device(cfg.device)
    torch.manual_seed(cfg.seed)
    path = build(cfg, device)
    backbone, tokenizer = path.backbone, path.tokenizer
    size = backbone.img_size
    if cfg.img_size and cfg.ckpt and tuple(size) != (cfg.img_size, cfg.img_size):
        size = (cfg.img_size, cfg.img_size)
    tokenizer.levels.check_image(size)
    mean, std = path.normalisation or (backbone.data_config["mean"], backbone.data_config["std"])
    if cfg.images:  # normalised as the checkpoint's data were, so its calibrated cuts hold
        images = _load_images(cfg.images, cfg.batch_size, size[0], mean, std).to(device)
    else:
        images = torch.randn(cfg.batch_size, 3, *size, device=device)
    dtype = DTYPES[cfg.dtype]
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    cut = None
    if cfg.fraction is not None:  # a trained policy runs as trained unless a fraction is asked for
        with autocast:
            cut = calibrate_policy(path, images, cfg.fraction)
    uniform = backbone.model
    if tuple(size) != tuple(backbone.img_size):  # timm's patch embedding checks the input size
        uniform.set_input_size(img_size=size)
    if cfg.compile:
        # Each path compiled as it is best served. timm's model whole, static shapes (its batch
        # never changes shape): the strongest uniform baseline, on a copy so that SPLIT's in-place
        # compile below is not traced into it. SPLIT's blocks in place with dynamic shapes, as its
        # packed length changes from batch to batch.
        uniform = torch.compile(copy.deepcopy(uniform), dynamic=False)
        for block in backbone.model.blocks:
            block.compile(dynamic=True)

    def run_uniform() -> Any:
        with torch.inference_mode(), autocast:
            return uniform(images)

    def run_split() -> Any:
        with torch.inference_mode(), autocast:
            return path(images)

    t_uniform, t_split = _interleaved(run_uniform, run_split, cfg.warmup, cfg.iters, device)
    with autocast:
        parts = breakdown(path, images, cfg.iters, device)
        with torch.inference_mode():
            layout = path.layout(images)
        backend = backbone.pack(layout)[1].backend.name  # as chosen under autocast (flash needs bf16)
    prefix = backbone.num_prefix_tokens
    finest = layout.grid_size[0] * layout.grid_size[1]
    flops_uniform = backbone_flops(backbone.model, [finest + prefix] * cfg.batch_size)
    flops_split = backbone_flops(backbone.model, [n + prefix for n in layout.seqlens])
    images_done = cfg.batch_size * cfg.iters
    result = {
        "config": {**asdict(cfg), "levels": list(tokenizer.levels.sizes), "img_size": list(size)},
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)",
        "attn_backend": backend,
        "throughput_uniform": images_done / t_uniform,
        "throughput_split": images_done / t_split,
        "speedup": t_uniform / t_split,
        "ideal_speedup": flops_uniform / flops_split,
        "token_fraction": float(layout.fraction.mean()),
        "tokens_uniform": finest,
        "tokens_split_mean": sum(layout.seqlens) / len(layout.seqlens),
        "gflops_uniform_per_image": flops_uniform / cfg.batch_size / 1e9,
        "gflops_split_per_image": flops_split / cfg.batch_size / 1e9,
        "time_ms": {k: v * 1e3 for k, v in parts.items()},
        "overhead_fraction": (parts["embed"] + parts["decide"] + parts["walk"]) / parts["backbone"],
        "peak_memory_mib_uniform": _peak_memory(run_uniform, device),
        "peak_memory_mib_split": _peak_memory(run_split, device),
        "host_syncs_per_batch": _host_syncs(run_split, device),
        "policy_cut": cut,
    }
    result["speedup_over_ideal"] = result["speedup"] / result["ideal_speedup"]
    if cfg.lm:
        result["vqa"] = bench_vqa(path, images, cfg, autocast, device)
    return result


def bench_vqa(
    path: SplitPath, images: Tensor, cfg: BenchConfig, autocast: Any, device: torch.device
) -> dict[str, Any]:
    """ViT + projector + LM prefill, uniform against SPLIT (`splitlab.commands.bench_lm`)."""
    from splitlab.commands.bench_lm import vqa_paths

    with torch.inference_mode(), autocast:
        uniform, split, described = vqa_paths(path, images, cfg.lm)
        t_uniform, t_split = _interleaved(uniform, split, cfg.warmup, cfg.iters, device)
    images_done = cfg.batch_size * cfg.iters
    return {
        **described,
        "images_per_second_uniform": images_done / t_uniform,
        "images_per_second_split": images_done / t_split,
        "speedup": t_uniform / t_split,
    }


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="SPLIT throughput against timm's uniform grid on the same batch")
    p.add_argument("--model", default="vit_base_patch16_224", help="timm model name (random init)")
    p.add_argument("--img-size", type=positive_int, default=None, help="image side (default: the model's)")
    p.add_argument("--patch-size", type=positive_int, default=None, help="patch size (default: the model's)")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="autocast dtype (float32: none)"
    )
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--levels", type=positive_int, nargs="+", default=None, help="patch sizes coarse to fine")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--ckpt", default=None, help="a trained SPLIT checkpoint (its policy decides)")
    source.add_argument(
        "--fraction", type=fraction, default=None, help="token fraction of a calibrated layout (default 0.7)"
    )
    p.add_argument("--images", default=None, help="a folder of images to use instead of random noise")
    p.add_argument("--warmup", type=count, default=2)
    p.add_argument("--iters", type=positive_int, default=5)
    p.add_argument("--attn-backend", default="auto")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile: timm's model whole (static shapes), SPLIT's blocks (dynamic); with --lm both paths run the per-block compile",
    )
    p.add_argument("--json", type=output_file, default=None, help="also write the numbers to this file")
    p.add_argument(
        "--lm",
        default=None,
        help="also time the VQA path: ViT + projector + this LM's prefill (a hub name, a folder, or a JSON config)",
    )


def main(args: argparse.Namespace) -> int:
    settings = {f.name: getattr(args, f.name) for f in fields(BenchConfig) if hasattr(args, f.name)}
    cfg = BenchConfig(
        **{**settings, "fraction": 0.7 if args.fraction is None and not args.ckpt else args.fraction}
    )
    result = run_bench(cfg)
    print(format_bench(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
