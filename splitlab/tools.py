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
    return 0


def ci_recipe(name: str = "classification") -> list[str]:
    """``--config`` arguments of a recipe and its CI twin (paths inside this checkout)."""
    recipe, twin = REPO / "tasks" / "imagenet.yaml", REPO / "configs" / "ci" / f"{name}.yaml"
    for path in (recipe, twin):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run the demo from a splitlab checkout")
    return ["--config", str(recipe), "--config", str(twin)]


def run_pipeline(out: str | Path, seed: int = 0, extra: Sequence[str] = (), quiet: bool = False) -> dict:
    """Generated data -> dense backbone -> warm start + PPO, all through the LightningCLI.

    Returns the run's summary record (also in ``<out>/summary.json``).
    """
    from splitlab.cli import lightning_main
    from splitlab.data import generate_shapes

    out = Path(out)
    data = out / "data"
    if not (data / "splitlab_dataset.json").exists():
        generate_shapes(data, seed=seed)
    common = [
        *ci_recipe(),
        f"--data.init_args.root={data}",
        f"--seed_everything={seed}",
        f"--model.init_args.sampling_seed={seed}",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.logger.init_args.name=",
    ]
    if quiet:
        common += ["--trainer.enable_progress_bar=false"]
    pretrain = out / "pretrain" / "checkpoints" / "last.ckpt"
    if not pretrain.exists():
        lightning_main(
            [
                "fit",
                *common,
                "--config",
                str(REPO / "configs" / "ci" / "pretrain.yaml"),
                f"--trainer.logger.init_args.save_dir={out}",
                "--trainer.logger.init_args.name=",
                "--trainer.logger.init_args.version=pretrain",
                *extra,
            ]
        )
    lightning_main(
        [
            "fit",
            *common,
            "--trainer.logger.init_args.version=",
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
