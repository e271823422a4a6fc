"""`splitlab bench --task detection|segmentation` (or ``--config RECIPE``, or a dense ``--ckpt``): a whole
detector or segmenter, images in and the task's outputs out (boxes after NMS and instance masks pasted
and encoded; per-pixel classes at the input's size), SPLIT at the budget against the same model on
timm's uniform grid.

Both paths share every weight and every step after the backbone: the uniform one runs timm's
``forward_intermediates`` (the blocks the head reads, as NCHW grids); SPLIT's its deployed layout, the
packed blocks and `TokenLayout.unpack_to_grid`; then the same pyramid, head and post-processing. They
alternate batch by batch (`interleaved`). An instrumented pass times each part, and the Amdahl ideal
is the end-to-end speed-up had only the backbone sped up by its own measured ratio (SPLIT's side
counting its tokenizer): what the head's share of the time leaves a shorter sequence to give.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import timm
import torch
import yaml
from torch import Tensor

from splitlab.commands.bench_measures import device_label, load_images
from splitlab.heads.pyramid import pyramid_grids
from splitlab.metrics import interleaved, pair_spread, timed
from splitlab.model import SplitDetector
from splitlab.model.preprocess import Placement
from splitlab.model.tasks import DenseModel

RECIPES = {"detection": "coco.yaml", "segmentation": "ade20k.yaml"}
PARTS = ("tokenizer", "backbone", "unpack", "pyramid", "head", "post")
REPO = Path(__file__).resolve().parents[2]


def task_recipe(task: str) -> Path:
    """The recipe of a dense task in this checkout (``tasks/coco.yaml``, ``tasks/ade20k.yaml``)."""
    path = REPO / "tasks" / RECIPES[task]
    if not path.is_file():
        raise FileNotFoundError(f"--task {task}: no recipe at {path}; give --config RECIPE instead")
    return path


def merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` over ``base``, mappings merged key by key (as a second ``--config`` overlays a first)."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def recipe_settings(paths: Sequence[str | Path]) -> tuple[str, dict[str, Any]]:
    """The task class path and ``init_args`` of the recipes' ``model`` section, later files over earlier."""
    section: dict[str, Any] = {}
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--config {path}: no such file")
        text = yaml.safe_load(Path(path).read_text())
        model = text.get("model") if isinstance(text, dict) else None
        if model is not None and not isinstance(model, dict):
            raise ValueError(f"--config {path}: its model section is not a mapping")
        section = merged(section, model or {})
    if "class_path" not in section:
        raise ValueError(f"--config {', '.join(map(str, paths))}: no model.class_path (a task recipe)")
    return section["class_path"], dict(section.get("init_args") or {})


def depth_of(name: str, kwargs: dict[str, Any]) -> int:
    """Blocks of a timm model, built on the meta device (no memory, no weights)."""
    with torch.device("meta"):
        return len(timm.create_model(name, pretrained=False, **kwargs).blocks)


def remapped_indices(indices: Sequence[int], old_depth: int, new_depth: int) -> list[int]:
    """The recipe's pyramid blocks at the same relative depths of another backbone ([23] of 24 -> [11]
    of 12; [7, 11, 15, 23] -> [3, 5, 7, 11])."""
    chosen = [round(((i % old_depth) + 1) * new_depth / old_depth) - 1 for i in indices]
    if len(set(chosen)) != len(chosen):
        raise ValueError(
            f"pyramid_indices={list(indices)} of a {old_depth}-block backbone do not map to distinct blocks "
            f"of a {new_depth}-block one: give the recipe's backbone or one at least as deep"
        )
    return chosen


def recipe_model(
    paths: Sequence[str | Path],
    backbone: str | None = None,
    img_size: int | None = None,
    patch_size: int | None = None,
    levels: Sequence[int] | None = None,
) -> DenseModel:
    """The dense model a recipe trains (its task's head, pyramid, levels, sizes), random init: with
    ``backbone`` (and its size options) in place of the recipe's, the pyramid's blocks kept at the same
    relative depths. A fresh detector's classifier is given a random bias (`prime_detector`)."""
    from jsonargparse import ArgumentParser

    from splitlab.tasks import SplitTask

    class_path, init_args = recipe_settings(paths)
    module, _, name = class_path.rpartition(".")
    task_class = getattr(__import__(module, fromlist=[name]), name, None)
    model_class = getattr(task_class, "model_class", None)
    if not (isinstance(model_class, type) and issubclass(model_class, DenseModel)):
        raise ValueError(
            f"--config {', '.join(map(str, paths))}: {class_path} is not a detection or segmentation task "
            "(`splitlab bench --model NAME` times a classifier)"
        )
    args = copy.deepcopy(init_args)
    args["pretrained"] = False  # nothing is downloaded; speed does not depend on the weights
    kwargs = dict(args.get("backbone_kwargs") or {})
    kwargs.pop("drop_path_rate", None)  # training only
    sizes = {k: v for k, v in (("img_size", img_size), ("patch_size", patch_size)) if v}
    if backbone and backbone != args.get("backbone"):
        old_depth = depth_of(args["backbone"], kwargs)
        kwargs = {**{k: v for k, v in kwargs.items() if k in ("img_size", "patch_size")}, **sizes}
        if args.get("pyramid_indices"):
            args["pyramid_indices"] = remapped_indices(
                args["pyramid_indices"], old_depth, depth_of(backbone, kwargs)
            )
        args["backbone"] = backbone
    args["backbone_kwargs"] = {**kwargs, **sizes}
    if levels:
        args["tokenizer"] = {**(args.get("tokenizer") or {}), "levels": list(levels)}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(SplitTask, "model")
    cfg = parser.parse_object({"model": {"class_path": class_path, "init_args": args}})
    instantiate = (
        getattr(parser, "instantiate", None) or parser.instantiate_classes
    )  # jsonargparse 4.49 renamed it
    model = instantiate(cfg).model.model
    if isinstance(model, SplitDetector):
        prime_detector(model)
    return model


def prime_detector(model: SplitDetector, seed: int = 0) -> None:
    """Give a random-init detector's box classifier a random bias (background off, classes N(0, 3)):
    its near-uniform scores would pass no score threshold, so NMS, the mask head and the paste would
    not run; primed, each image yields its ``box_detections_per_img`` detections, as a trained
    detector does, and the head is timed on that much work. Both paths share it."""
    predictor = model.head.detector.roi_heads.box_predictor
    generator = torch.Generator().manual_seed(seed)
    bias = 3.0 * torch.randn(predictor.cls_score.bias.shape, generator=generator)
    bias[0] = -10.0
    with torch.no_grad():
        predictor.cls_score.bias.copy_(bias)


def network_placements(images: Tensor) -> list[Placement]:
    """Inputs already at the network's size (noise): nothing to undo."""
    h, w = images.shape[-2:]
    return [Placement(width=w, height=h, scale=1.0, resized=(h, w)) for _ in range(images.shape[0])]


def head_part(model: DenseModel, pyramid: Any, size: tuple[int, int]) -> Any:
    """The head on the pyramid: the detector's RPN, RoI heads and NMS; the segmenter's decode head."""
    outputs = model.head.from_pyramid(pyramid, size)
    return model.head.detect(outputs) if isinstance(model, SplitDetector) else outputs


def post_part(model: DenseModel, decoded: Any, placements: Sequence[Placement]) -> list[dict[str, Any]]:
    """What a user gets per image: boxes and pasted masks in the input's pixels; class per pixel."""
    if isinstance(model, SplitDetector):
        return model.finish(decoded, placements)
    return model.results(decoded, placements)


class DensePaths:
    """The two paths of one dense model on one batch, whole and part by part."""

    def __init__(self, model: DenseModel, images: Tensor, placements: Sequence[Placement]) -> None:
        self.model, self.images, self.placements = model, images, list(placements)
        self.size = tuple(images.shape[-2:])

    def uniform(self) -> list[dict[str, Any]]:
        return self.model.results(self.model.forward_uniform(self.images), self.placements)

    def split(self) -> list[dict[str, Any]]:
        return self.model.results(self.model(self.images)[0], self.placements)

    def uniform_parts(self) -> list[Callable[[Any], Any]]:
        """The uniform path's steps, each fed the last one's result (its unpacking is timm's view)."""
        model = self.model
        return [
            lambda _: None,
            lambda _: model.uniform_grids(self.images),
            lambda grids: grids,
            lambda grids: model.head.pyramid(grids),
            lambda pyramid: head_part(model, pyramid, self.size),
            lambda decoded: post_part(model, decoded, self.placements),
        ]

    def split_parts(self) -> list[Callable[[Any], Any]]:
        model = self.model
        return [
            lambda _: model.layout(self.images),
            lambda layout: model.backbone(layout, indices=model.backbone_indices()),
            lambda features: pyramid_grids(features),
            lambda grids: model.head.pyramid(grids),
            lambda pyramid: head_part(model, pyramid, self.size),
            lambda decoded: post_part(model, decoded, self.placements),
        ]


def part_times(
    steps: Sequence[Callable[[Any], Any]], iters: int, device: torch.device
) -> tuple[dict[str, float], Any]:
    """Seconds per batch of each part (a sync between parts), averaged over ``iters`` passes, and the
    last pass's results."""
    out = dict.fromkeys(PARTS, 0.0)
    value: Any = None
    for _ in range(iters):
        value = None
        for name, step in zip(PARTS, steps, strict=True):
            with timed(device) as elapsed:
                value = step(value)
            out[name] += elapsed() / iters
    return out, value


def detections(results: Sequence[dict[str, Any]]) -> float | None:
    """Mean detections per image (None for a segmenter): the head's and the paste's work depend on it."""
    if not results or "boxes" not in results[0]:
        return None
    return sum(len(r["boxes"]) for r in results) / len(results)


def amdahl(uniform: dict[str, float], split: dict[str, float]) -> dict[str, float]:
    """The backbone's own measured speed-up (SPLIT's side with its tokenizer) and the end-to-end speed-up
    it would give were nothing else to change: ``T / (T - B + B / r)``."""
    total = sum(uniform.values())
    ratio = uniform["backbone"] / (split["tokenizer"] + split["backbone"])
    rest = total - uniform["backbone"]
    return {
        "backbone_speedup": ratio,
        "backbone_share_uniform": uniform["backbone"] / total,
        "amdahl_ideal": total / (rest + uniform["backbone"] / ratio),
    }


def bench_dense(
    model: DenseModel,
    images: Tensor,
    placements: Sequence[Placement],
    device: torch.device,
    autocast: Any,
    warmup: int,
    iters: int,
    min_seconds: float = 0.0,
) -> dict[str, Any]:
    """End to end, interleaved, then part by part; the Amdahl ideal and SPLIT's share of it."""
    paths = DensePaths(model, images, placements)

    def uniform() -> Any:
        with torch.inference_mode(), autocast:
            return paths.uniform()

    def split() -> Any:
        with torch.inference_mode(), autocast:
            return paths.split()

    t_uniform, t_split = interleaved(uniform, split, warmup, iters, device, min_seconds)
    with torch.inference_mode(), autocast:
        parts_uniform, results_uniform = part_times(paths.uniform_parts(), iters, device)
        parts_split, results_split = part_times(paths.split_parts(), iters, device)
        layout = model.layout(images)
    batch = images.shape[0]
    speedup = sum(t_uniform) / sum(t_split)
    ideal = amdahl(parts_uniform, parts_split)
    return {
        "task": model.task,
        "images_per_second_uniform": batch * len(t_uniform) / sum(t_uniform),
        "images_per_second_split": batch * len(t_split) / sum(t_split),
        "speedup": speedup,
        "speedup_spread": pair_spread(t_uniform, t_split),
        "token_fraction": float(layout.fraction.mean()),
        "parts_ms_per_image_uniform": {k: 1e3 * v / batch for k, v in parts_uniform.items()},
        "parts_ms_per_image_split": {k: 1e3 * v / batch for k, v in parts_split.items()},
        **ideal,
        "share_of_amdahl_ideal": speedup / ideal["amdahl_ideal"],
        "detections_per_image_uniform": detections(results_uniform),
        "detections_per_image_split": detections(results_split),
    }


def format_dense(r: dict[str, Any]) -> str:
    """The dense bench as text: the end-to-end line, then each part's ms per image on both paths."""
    u, s = r["parts_ms_per_image_uniform"], r["parts_ms_per_image_split"]
    lines = [
        f"{r['task']}: uniform {r['images_per_second_uniform']:.3f} img/s, SPLIT {r['images_per_second_split']:.3f} "
        f"img/s at token fraction {r['token_fraction']:.3f}: {r['speedup']:.3f}x end to end "
        f"(pairs q1-q3 {r['speedup_spread']['q1']:.3f}-{r['speedup_spread']['q3']:.3f})",
        f"Amdahl ideal {r['amdahl_ideal']:.3f}x (the backbone {r['backbone_speedup']:.3f}x, "
        f"{r['backbone_share_uniform']:.1%} of the uniform time): SPLIT achieves {r['share_of_amdahl_ideal']:.1%} of it",
        f"{'ms per image':<12} {'uniform':>10} {'SPLIT':>10} {'SPLIT/uniform':>14}",
    ]
    for part in PARTS:
        ratio = f"{s[part] / u[part]:.3f}" if u[part] > 0.05 else "-"
        lines.append(f"{part:<12} {u[part]:>10.1f} {s[part]:>10.1f} {ratio:>14}")
    total_u, total_s = sum(u.values()), sum(s.values())
    lines.append(f"{'total':<12} {total_u:>10.1f} {total_s:>10.1f} {total_s / total_u:>14.3f}")
    if r.get("detections_per_image_uniform") is not None:  # the head's and the paste's work
        lines.append(
            f"detections per image: uniform {r['detections_per_image_uniform']:.1f}, "
            f"SPLIT {r['detections_per_image_split']:.1f}"
        )
    return "\n".join(lines)


def dense_images(
    model: DenseModel, folder: str | None, count: int, device: torch.device
) -> tuple[Tensor, list[Placement]]:
    """``count`` images at the model's input size: the ``--images`` files letterboxed as its data were
    (repeated if fewer), with where each lies in the input; or noise filling the input."""
    if folder is None:
        images = torch.randn(count, 3, *model.backbone.img_size, device=device)
        return images, network_placements(images)
    images, placements = load_images(folder, count, model.preprocessing)
    return images.to(device), placements


def run_dense(
    cfg: Any, model: DenseModel, device: torch.device, autocast: Any, calibrate: Callable[..., float]
) -> dict[str, Any]:
    """`splitlab bench` of a detector or segmenter (``cfg``: its `BenchConfig`; ``calibrate``: how
    bench fits a policy's cuts on a batch): calibrated at the budget on the batch, then `bench_dense`."""
    refused = [name for name in ("predict", "lm", "dense_ideal", "compile") if getattr(cfg, name)]
    if refused:
        options = ", ".join("--" + name.replace("_", "-") for name in refused)
        raise ValueError(
            f"{options}: not for a detector or segmenter (the dense bench times the whole model)"
        )
    model = model.to(device).eval()
    model.backbone.attn_backend = cfg.attn_backend
    images, placements = dense_images(model, cfg.images, cfg.batch_size, device)
    holds = model.holds() if cfg.ckpt else None  # as trained, before any calibration here
    budget = cfg.budget if cfg.budget is not None else model.budget
    cut = None  # a trained policy runs as trained unless a budget is asked for; a fresh one is fitted
    if cfg.budget is not None or not cfg.ckpt:
        with autocast:
            cut = calibrate(model, images, budget)
    result = bench_dense(model, images, placements, device, autocast, cfg.warmup, cfg.iters, cfg.min_seconds)
    with torch.inference_mode(), autocast:
        backend = model.backbone.pack(model.layout(images[:1]))[1].backend.name
    name = cfg.ckpt or model.config["backbone"]
    return {
        "config": {
            **dataclasses.asdict(cfg),
            "model": name,
            "levels": list(model.levels.sizes),
            "img_size": list(model.backbone.img_size),
            "budget": budget,
        },
        "device_name": device_label(device),
        "attn_backend": backend,
        "policy_cut": cut,
        "holds": holds,
        "dense": result,
    }


def format_dense_run(record: dict[str, Any]) -> str:
    """One dense run: what ran, then `format_dense`."""
    cfg = record["config"]
    head = (
        f"{cfg['model']} @ {cfg['img_size'][0]} px, levels {tuple(cfg['levels'])}, budget {cfg['budget']:g}; "
        f"{record['device_name']} / {cfg['dtype']} / batch {cfg['batch_size']} / {record['attn_backend']}"
    )
    held = f"\ncheckpoint holds {record['holds']}" if record.get("holds") else ""
    return head + held + "\n" + format_dense(record["dense"])
