"""splitlab's own subcommands: ``data`` (dataset generators), ``bench`` and ``demo``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _data_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="write small datasets in the real formats")
    kinds = data.add_subparsers(dest="kind", required=True)
    shapes = kinds.add_parser(
        "shapes", help="ImageFolder (or HF) classification set whose class lives in fine detail"
    )
    shapes.add_argument("--out", required=True, help="output directory")
    shapes.add_argument("--image-size", type=int, default=64)
    shapes.add_argument("--train", type=int, default=600, help="training images per class")
    shapes.add_argument("--val", type=int, default=150, help="validation images per class")
    shapes.add_argument("--test", type=int, default=150, help="test images per class")
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--format", choices=("imagefolder", "hf"), default="imagefolder")
    shapes.add_argument("--detail", type=int, default=2, help="pattern feature width in pixels")
    for name, help_ in (
        ("ade20k", "ADE20K-layout segmentation scenes"),
        ("coco", "COCO-format detection scenes (instances JSON)"),
    ):
        scenes = kinds.add_parser(name, help=help_)
        scenes.add_argument("--out", required=True, help="output directory")
        scenes.add_argument("--image-size", type=int, default=128)
        scenes.add_argument("--train", type=int, default=400, help="training images")
        scenes.add_argument("--val", type=int, default=100, help="validation images")
        scenes.add_argument("--seed", type=int, default=0)


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo", help="the whole pipeline on generated data: data, backbone, warm start, PPO, table"
    )
    demo.add_argument(
        "--out", default="runs/demo", help="run directory (summary.json and token maps land here)"
    )
    demo.add_argument("--seed", type=int, default=0)


def run_data(args: argparse.Namespace) -> int:
    from splitlab.data import generate_shapes

    if args.kind == "shapes":
        out = generate_shapes(
            args.out, args.image_size, args.train, args.val, args.test, args.seed, args.format, args.detail
        )
        print(f"wrote {args.format} dataset to {out}")
    else:
        from splitlab.data.scenes import generate_ade20k, generate_coco

        make = generate_ade20k if args.kind == "ade20k" else generate_coco
        out = make(args.out, args.image_size, args.train, args.val, args.seed)
        print(f"wrote {args.kind}-format dataset to {out}")
    return 0


# CI twins: recipe, its tiny CI config, the config of the dense (backbone) stage, the data generator.
PIPELINES = {
    "classification": ("imagenet.yaml", "classification.yaml", "pretrain.yaml"),
    "coco": ("coco.yaml", "coco.yaml", "pretrain_dense.yaml"),
    "ade20k": ("ade20k.yaml", "ade20k.yaml", "pretrain_dense.yaml"),
}


def ci_recipe(task: str = "classification") -> list[str]:
    """``--config`` arguments of a recipe and its CI twin (paths inside this checkout)."""
    recipe, twin, _ = PIPELINES[task]
    paths = (REPO / "tasks" / recipe, REPO / "configs" / "ci" / twin)
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run the demo from a splitlab checkout")
    return ["--config", str(paths[0]), "--config", str(paths[1])]


def generate_for(task: str, out: Path, seed: int) -> None:
    """The generated dataset a CI twin reads."""
    from splitlab.data import generate_ade20k, generate_coco, generate_shapes

    if task == "classification":
        generate_shapes(out, seed=seed)
    elif task == "coco":
        generate_coco(out, train=300, val=80, seed=seed)
    else:
        generate_ade20k(out, train=300, val=80, seed=seed)
    (out / ".complete").write_text("")


def run_pipeline(
    out: str | Path,
    seed: int = 0,
    extra: Sequence[str] = (),
    quiet: bool = False,
    task: str = "classification",
) -> dict:
    """Generated data -> dense backbone -> warm start + PPO, all through the LightningCLI.

    Returns the run's summary record (also in ``<out>/summary.json``). Finished steps (data, the
    dense backbone) are reused when ``out`` already holds them.
    """
    from splitlab.cli import lightning_main

    if task not in PIPELINES:
        raise ValueError(f"task={task!r}: expected one of {sorted(PIPELINES)}")
    out = Path(out)
    data = out / "data"
    if not (data / ".complete").exists():
        generate_for(task, data, seed)
    # overrides follow every --config, so the dense stage's config cannot reset them
    overrides = [
        f"--data.init_args.root={data}",
        f"--seed_everything={seed}",
        f"--model.init_args.sampling_seed={seed}",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.logger.init_args.name=",
    ]
    if quiet:
        overrides += ["--trainer.enable_progress_bar=false"]
    pretrain = out / "pretrain" / "checkpoints" / "last.ckpt"
    if not pretrain.exists():
        dense = REPO / "configs" / "ci" / PIPELINES[task][2]
        version = "--trainer.logger.init_args.version=pretrain"
        lightning_main(["fit", *ci_recipe(task), "--config", str(dense), *overrides, version, *extra])
    version = "--trainer.logger.init_args.version="
    lightning_main(
        [
            "fit",
            *ci_recipe(task),
            *overrides,
            version,
            f"--model.init_args.init_checkpoint={pretrain}",
            *extra,
        ]
    )
    return json.loads((out / "summary.json").read_text())


def run_demo(args: argparse.Namespace) -> int:
    from splitlab.tasks.evaluation import format_table

    record = run_pipeline(args.out, args.seed)
    print("\n" + format_table(record))
    print(f"\nsummary: {Path(args.out) / 'summary.json'}   token maps: {Path(args.out) / 'token_maps'}")
    return 0


def run(argv: Sequence[str]) -> int:
    """Dispatch ``splitlab data|bench|demo``."""
    parser = argparse.ArgumentParser(
        prog="splitlab", description="splitlab tools (fit/validate/test/predict: LightningCLI)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _data_parser(sub)
    _demo_parser(sub)
    from splitlab import bench

    bench.add_parser(sub)
    args = parser.parse_args(list(argv))
    if args.command == "bench":
        return bench.main(args)
    if args.command == "data":
        return run_data(args)
    if args.command == "demo":
        return run_demo(args)
    parser.error(f"unknown command {args.command}")
    return 2
