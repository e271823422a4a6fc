"""`splitlab bench`'s options (`splitlab.commands.bench` runs them)."""

from __future__ import annotations

import argparse

from splitlab.commands.arguments import (
    count,
    device_name,
    fraction,
    output_file,
    positive_int,
    positive_int_list,
)
from splitlab.commands.bench_measures import DTYPES


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The model, its inputs' sizes, the device and the policy compared; then `add_passes`."""
    p = sub.add_parser("bench", help="SPLIT throughput against timm's uniform grid on the same batch")
    p.add_argument(
        "--model",
        default=None,
        help="timm model name, random init (default vit_base_patch16_224; with --task or --config the "
        "recipe's backbone)",
    )
    dense = p.add_mutually_exclusive_group()
    dense.add_argument(
        "--task",
        choices=("detection", "segmentation"),
        default=None,
        help="the whole detector (tasks/coco.yaml) or segmenter (tasks/ade20k.yaml): images in, boxes and "
        "pasted masks or per-pixel classes out, against the same model on the uniform grid, part by part, "
        "with the Amdahl ideal (splitlab.commands.bench_dense); --model swaps the recipe's backbone",
    )
    dense.add_argument(
        "--config",
        dest="recipe",
        action="append",
        default=None,
        help="as --task, from this detection or segmentation recipe (repeat to overlay, as lightning fit)",
    )
    p.add_argument("--img-size", type=positive_int, default=None, help="image side (default: the model's)")
    p.add_argument("--patch-size", type=positive_int, default=None, help="patch size (default: the model's)")
    p.add_argument(
        "--batch-size", type=positive_int, default=None, help="default 8 (2 with --task or --config)"
    )
    p.add_argument(
        "--batch-sizes",
        type=positive_int_list,
        default=None,
        help="a sweep, e.g. 1,8,32,64: one row per batch size (speed-up and its spread, ideal, overhead, latency)",
    )
    p.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        help="time each path at least this long per batch size (default: 0, or 20 in a sweep)",
    )
    p.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="autocast dtype (float32: none)"
    )
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--levels", type=positive_int, nargs="+", default=None, help="patch sizes coarse to fine")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--ckpt", default=None, help="a trained SPLIT checkpoint (its policy decides)")
    source.add_argument(
        "--budget",
        type=fraction,
        default=None,
        help="the budget: token fraction of a calibrated layout (default 0.7)",
    )
    add_passes(p)


def add_passes(p: argparse.ArgumentParser) -> None:
    """The inputs and the passes timed beside the forward: predict, training, the dense ideal, the LM."""
    p.add_argument("--images", default=None, help="a folder of images to use instead of random noise")
    p.add_argument(
        "--predict",
        action="store_true",
        help="also time the end-to-end predict path (decode, preprocess, model, results) on the --images "
        "files against the same loader with timm's model (classification models)",
    )
    p.add_argument("--workers", type=count, default=1, help="--predict: decoding workers")
    p.add_argument(
        "--train",
        action="store_true",
        help="time training instead: one step of each stage (dense, warm start, PPO and its rollouts) per "
        "image, from a real fit on one repeated batch of random images (splitlab.commands.bench_train)",
    )
    p.add_argument(
        "--dense-ideal",
        action="store_true",
        help="also time timm's blocks on a dense batch of SPLIT's mean length against the uniform grid's: "
        "the speed-up this hardware allows that many tokens (splitlab.commands.bench_ideal)",
    )
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="keep glibc's defaults, which give freed memory back and fault it in again on the next batch "
        "(by default bench keeps it, as splitlab predict does: splitlab.commands.allocator)",
    )
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
