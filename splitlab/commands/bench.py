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
import dataclasses
import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor

from splitlab.commands.allocator import keep_freed_memory
from splitlab.commands.bench_args import add_parser as add_parser  # the options, read here by TOOLS
from splitlab.commands.bench_dense import format_dense_run, run_dense
from splitlab.commands.bench_measures import (
    DTYPES,
    breakdown,
    device_label,
    load_images,
    overheads,
    resources,
    speeds,
    token_costs,
)
from splitlab.commands.bench_table import format_bench, format_sweep
from splitlab.metrics import interleaved
from splitlab.model import SplitClassifier, SplitModel, load
from splitlab.model.calibrate import fit_cuts
from splitlab.model.predict import image_files
from splitlab.model.tasks import DenseModel


@dataclass
class BenchConfig:
    """What to measure (see ``splitlab bench --help``)."""

    model: str | None = "vit_base_patch16_224"  # a dense recipe's own backbone where None
    img_size: int | None = None
    batch_size: int = 8
    dtype: str = "float32"
    device: str = "cpu"
    levels: Sequence[int] | None = None
    ckpt: str | None = None
    budget: float | None = 0.7
    images: str | None = None
    warmup: int = 2
    iters: int = 5
    attn_backend: str = "auto"
    compile: bool = False
    seed: int = 0
    lm: str | None = None
    patch_size: int | None = None
    predict: bool = False
    workers: int = 1
    min_seconds: float = 0.0
    dense_ideal: bool = False
    system_malloc: bool = False
    task: str | None = None
    recipe: Sequence[str] | None = None


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def split_forward(model: SplitModel, images: Tensor) -> Tensor:
    """The SPLIT side of the comparison: the deployed layout (tokenizer at the model's budget and
    cap), the packed backbone and timm's head: what timm's own forward computes on the uniform grid."""
    backbone = model.backbone
    return backbone.forward_head(backbone(model.layout(images)))


def build(cfg: BenchConfig, device: torch.device) -> SplitModel:
    """The model: a trained one (its budget, cap and preprocessing), or fresh (random init) around a
    timm model."""
    if cfg.ckpt:
        model = load(cfg.ckpt, setting="--ckpt")
        if model.policy != "learned":  # bench times the decision module; this run does not deploy it
            raise ValueError(
                f"--ckpt {cfg.ckpt}: this run deploys policy {model.policy!r}, not a learned one, so "
                "its decision module was never trained; bench the same model at the same budget with "
                f"--budget {model.budget:g} (a calibrated layout) instead"
            )
        model.backbone.attn_backend = cfg.attn_backend
    elif cfg.task or cfg.recipe:  # a detector or segmenter as its recipe builds it
        from splitlab.commands.bench_dense import recipe_model, task_recipe

        paths = list(cfg.recipe) if cfg.recipe else [task_recipe(cfg.task)]
        model = recipe_model(paths, cfg.model, cfg.img_size, cfg.patch_size, cfg.levels)
        if cfg.task and model.task != cfg.task:
            raise ValueError(f"--task {cfg.task}: --config {', '.join(paths)} trains {model.task}")
    else:
        kwargs: dict[str, Any] = {"img_size": cfg.img_size} if cfg.img_size else {}
        if cfg.patch_size:  # e.g. EVA-02 converted to /16, as the dense recipes use it
            kwargs["patch_size"] = cfg.patch_size
        config = {
            "backbone": cfg.model or BenchConfig.model,
            "backbone_kwargs": kwargs,
            "attn_backend": cfg.attn_backend,
        }
        config["levels"] = list(cfg.levels) if cfg.levels else None
        pretrained = timm.get_pretrained_cfg(cfg.model.split(".")[0]) if timm.is_model(cfg.model) else None
        if pretrained is not None and not pretrained.num_classes:  # a tower without a classifier
            config["head"] = {"num_classes": 1000}  # (DINOv2, SigLIP-so400m): both paths time one
        model = SplitClassifier(config)
        if cfg.budget is not None and cfg.budget != model.budget:  # the one budget it deploys
            model.levels.check_fraction(cfg.budget, "--budget")
            model = SplitClassifier({**config, "budget": float(cfg.budget)})
    return model.to(device).eval()


@torch.inference_mode()
def calibrate_policy(model: SplitModel, images: Tensor, budget: float) -> float:
    """Fit the policy's cuts on ``images`` (`splitlab.model.calibrate.fit_cuts`, what ``splitlab
    calibrate`` does) and deploy ``budget``: the split path then runs exactly as deployed, at a known
    token count. Returns the deployed logit cut."""
    model.levels.check_fraction(budget, "--budget")
    fit_cuts(model, [images], budget)
    points = model.tokenizer.operating_points
    return float(points.cut(torch.tensor([budget], device=points.cuts.device))[0])


def check_config(cfg: BenchConfig) -> None:
    """Refuse settings that cannot be measured before any model is built, naming the option."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"--dtype {cfg.dtype}: expected one of {sorted(DTYPES)}")
    if cfg.ckpt is None and cfg.budget is None and not (cfg.task or cfg.recipe):
        raise ValueError("give --ckpt (a trained SPLIT checkpoint) or --budget (a calibrated layout)")
    if cfg.images and not Path(cfg.images).is_dir():
        raise FileNotFoundError(f"--images {cfg.images}: no such folder")
    if cfg.predict and not cfg.images:
        raise ValueError("--predict times the predict path on files: give --images FOLDER")
    if cfg.compile and cfg.warmup < 1:
        raise ValueError("--compile with --warmup 0 would time the compilation: give --warmup 1 or more")


def bench_images(cfg: BenchConfig, model: SplitModel, device: torch.device) -> tuple[tuple[int, int], Tensor]:
    """The input size (the model's, or ``--img-size`` for a trained one) and the batch both paths run:
    the ``--images`` files preprocessed as the model's data were (so its calibrated cuts hold), or noise."""
    img_size = model.backbone.img_size
    if cfg.img_size and cfg.ckpt and tuple(img_size) != (cfg.img_size, cfg.img_size):
        img_size = (cfg.img_size, cfg.img_size)
    model.tokenizer.levels.check_image(img_size)
    if cfg.images:
        images = load_images(cfg.images, cfg.batch_size, model.preprocessing, img_size[0])[0].to(device)
    else:
        images = torch.randn(cfg.batch_size, 3, *img_size, device=device)
    return img_size, images


def uniform_model(model: SplitModel, img_size: Sequence[int], compiled: bool) -> Any:
    """timm's own model at ``img_size``: the uniform side. With ``compiled`` each path is compiled as it
    is best served: timm's model whole, static shapes (its batch never changes shape), the strongest
    uniform baseline, on a copy so that SPLIT's in-place compile is not traced into it; SPLIT's blocks
    in place with dynamic shapes, as its packed length changes from batch to batch."""
    backbone = model.backbone
    uniform = backbone.model
    if tuple(img_size) != tuple(backbone.img_size):  # timm's patch embedding checks the input size
        uniform.set_input_size(img_size=img_size)
    if compiled:
        uniform = torch.compile(copy.deepcopy(uniform), dynamic=False)
        for block in backbone.model.blocks:
            block.compile(dynamic=True)
    return uniform


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Measure and return the table's numbers (see the module docstring)."""
    check_config(cfg)
    device = _device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = build(cfg, device)
    dtype = DTYPES[cfg.dtype]
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    if isinstance(model, DenseModel):  # a detector or segmenter: the whole model
        return run_dense(cfg, model, device, autocast, calibrate_policy)
    img_size, images = bench_images(cfg, model, device)
    holds = model.holds() if cfg.ckpt else None  # what the checkpoint holds (`SplitModel.holds`), as trained
    cut = None
    if cfg.budget is not None:  # a trained policy runs as trained unless a budget is asked for
        with autocast:
            cut = calibrate_policy(model, images, cfg.budget)
    uniform = uniform_model(model, img_size, cfg.compile)

    def run_uniform() -> Any:
        with torch.inference_mode(), autocast:
            return uniform(images)

    def run_split() -> Any:
        with torch.inference_mode(), autocast:
            return split_forward(model, images)

    times = interleaved(run_uniform, run_split, cfg.warmup, cfg.iters, device, cfg.min_seconds)
    with autocast:
        parts = breakdown(model, images, cfg.iters, device)
        with torch.inference_mode():  # as timed: autocast (flash needs bf16), no autograd (CPU's auto)
            layout = model.layout(images)
            backend = model.backbone.pack(layout)[1].backend.name
    result = {
        "config": {**asdict(cfg), "levels": list(model.tokenizer.levels.sizes), "img_size": list(img_size)},
        "device_name": device_label(device),
        "attn_backend": backend,
        **speeds(*times, cfg.batch_size),
        **token_costs(model, layout, cfg.batch_size),
        **overheads(parts),
        **resources(run_uniform, run_split, device),
        "policy_cut": cut,
        "holds": holds,
    }
    result["speedup_over_ideal"] = result["speedup"] / result["ideal_speedup"]
    # the typical pair's: on a shared host a burst of other work slows a few pairs, which the
    # throughput ratio above counts in full (the sweep's table reports this one)
    result["speedup_median_over_ideal"] = result["speedup_spread"]["median"] / result["ideal_speedup"]
    add_optional_paths(result, cfg, model, uniform, images, autocast, device)
    return result


def add_optional_paths(
    result: dict[str, Any],
    cfg: BenchConfig,
    model: SplitModel,
    uniform: Any,
    images: Tensor,
    autocast: Any,
    device: torch.device,
) -> None:
    """The measurements asked for beside the backbone's (``--predict``, ``--lm``, ``--dense-ideal``),
    each with its share of the backbone speed-up, into ``result``."""
    if cfg.predict:
        result["predict"] = bench_predict(model, uniform, cfg, device)
        result["predict"]["share_of_backbone_speedup"] = result["predict"]["speedup"] / result["speedup"]
    if cfg.lm:
        result["vqa"] = bench_vqa(model, images, cfg, autocast, device)
    if cfg.dense_ideal:
        from splitlab.commands.bench_ideal import dense_ideal

        result["dense_ideal"] = dense_ideal(
            model, images, autocast, device, cfg.warmup, cfg.iters, cfg.min_seconds
        )
        dense = result["dense_ideal"]
        result["speedup_over_dense_ideal"] = result["speedup"] / dense["speedup"]
        result["speedup_median_over_dense_ideal"] = (
            result["speedup_spread"]["median"] / dense["speedup_spread"]["median"]
        )


def bench_predict(model: SplitModel, uniform: Any, cfg: BenchConfig, device: torch.device) -> dict[str, Any]:
    """End to end on the ``--images`` files, as ``splitlab predict`` runs: decoding and preprocessing in
    DataLoader workers, the model, results per image; the uniform side is the same loader, timm's
    model and the same results. Whole passes, alternating, after one warm-up pass of each."""
    from torch.utils.data import DataLoader

    from splitlab.model.predict import InputImages, collate

    files = image_files([cfg.images])
    batch, workers = cfg.batch_size, cfg.workers

    def run_uniform() -> None:
        loader = DataLoader(
            InputImages(files, model.preprocessing), batch, num_workers=workers, collate_fn=collate
        )
        with torch.inference_mode():
            for _, images, placements, _ in loader:
                model.results(uniform(images.to(device)), placements)

    fractions: list[float] = []

    def run_split() -> None:
        results = model.predict(files, batch_size=batch, num_workers=workers)
        fractions[:] = [r["token_fraction"] for r in results]

    t_uniform, t_split = map(sum, interleaved(run_uniform, run_split, 1, cfg.iters, device))
    done = len(files) * cfg.iters
    return {
        "images": len(files),
        "workers": workers,
        "images_per_second_uniform": done / t_uniform,
        "images_per_second_split": done / t_split,
        "speedup": t_uniform / t_split,
        "token_fraction": sum(fractions) / len(fractions),  # over the files (the batch above: its own)
    }


def bench_vqa(
    model: SplitModel, images: Tensor, cfg: BenchConfig, autocast: Any, device: torch.device
) -> dict[str, Any]:
    """ViT + projector + LM prefill, uniform against SPLIT (`splitlab.commands.bench_lm`)."""
    from splitlab.commands.bench_lm import vqa_paths

    with torch.inference_mode(), autocast:
        uniform, split, described = vqa_paths(model, images, cfg.lm)
        t_uniform, t_split = map(sum, interleaved(uniform, split, cfg.warmup, cfg.iters, device))
    images_done = cfg.batch_size * cfg.iters
    return {
        **described,
        "images_per_second_uniform": images_done / t_uniform,
        "images_per_second_split": images_done / t_split,
        "speedup": t_uniform / t_split,
    }


def main(args: argparse.Namespace) -> int:
    settings = {f.name: getattr(args, f.name) for f in fields(BenchConfig) if hasattr(args, f.name)}
    dense = bool(args.task or args.recipe)  # a recipe's budget, backbone and a batch its size affords
    budget = 0.7 if args.budget is None and not (args.ckpt or dense) else args.budget
    if args.model is None and not dense:
        settings["model"] = BenchConfig.model
    settings["batch_size"] = args.batch_size or (2 if dense else BenchConfig.batch_size)
    cfg = BenchConfig(**{**settings, "budget": budget})
    # as splitlab predict runs; both paths of a comparison share the process, so both get it
    kept = not cfg.system_malloc and keep_freed_memory()
    sizes = args.batch_sizes
    if args.train:
        return train_main(args, cfg, sizes or [cfg.batch_size])
    seconds = args.min_seconds if args.min_seconds is not None else (20.0 if sizes else 0.0)
    cfg = dataclasses.replace(cfg, min_seconds=seconds)
    if sizes:
        runs = [run_bench(dataclasses.replace(cfg, batch_size=b)) for b in sizes]
        result: dict[str, Any] = {"sweep": [{**r, "freed_memory_kept": kept} for r in runs]}
        print(
            format_sweep(result["sweep"])
            if "dense" not in runs[0]
            else "\n\n".join(map(format_dense_run, runs))
        )
    else:
        result = {**run_bench(cfg), "freed_memory_kept": kept}
        print(format_bench(result) if "dense" not in result else format_dense_run(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def train_main(args: argparse.Namespace, cfg: BenchConfig, sizes: Sequence[int]) -> int:
    """``splitlab bench --train``: one table per batch size (`splitlab.commands.bench_train`)."""
    from splitlab.commands.bench_train import bench_train, format_train

    if cfg.ckpt or cfg.images or cfg.predict or cfg.lm or cfg.compile or cfg.task or cfg.recipe:
        raise ValueError(
            "--train times a fresh timm classifier on random images: drop --ckpt, --images, "
            "--predict, --lm, --compile, --task and --config"
        )
    runs = [
        bench_train(
            cfg.model,
            size,
            cfg.budget,
            levels=list(cfg.levels) if cfg.levels else None,
            img_size=cfg.img_size,
            patch_size=cfg.patch_size,
            dtype=cfg.dtype,
            device=cfg.device,
            warmup=max(cfg.warmup, 1),
            iters=cfg.iters,
            seed=cfg.seed,
        )
        for size in sizes
    ]
    print("\n\n".join(format_train(r) for r in runs))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"train": runs}, indent=2) + "\n")
    return 0
