"""``splitlab data shapes|coco|ade20k|vqa --out DIR``: write small datasets in the real formats."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitlab.commands.arguments import positive_int, seed_value


def add_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="write small datasets in the real formats")
    kinds = data.add_subparsers(dest="kind", required=True)
    add_shapes(kinds)
    for name, help_ in (
        ("ade20k", "ADE20K-layout segmentation scenes"),
        ("coco", "COCO-format detection scenes (instances JSON)"),
    ):
        scenes = kinds.add_parser(name, help=help_)
        add_written(scenes, 128, (400, "training images"), (100, "validation images"))
        add_difficulty(scenes)
    add_vocabulary(kinds)
    add_vqa(kinds)


def add_written(
    p: argparse.ArgumentParser, img_size: int, train: tuple[int, str], val: tuple[int, str]
) -> None:
    """The options every generated dataset has (where, how large, how many, which seed), each kind
    with its own defaults (``train`` and ``val``: the count and what it counts): they are the
    generators' keyword arguments of the same names."""
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--img-size", type=positive_int, default=img_size, help="image side in pixels")
    p.add_argument("--train", type=positive_int, default=train[0], help=train[1])
    p.add_argument("--val", type=positive_int, default=val[0], help=val[1])
    p.add_argument("--seed", type=seed_value, default=0)


def add_difficulty(p: argparse.ArgumentParser) -> None:
    """``--difficulty``: the default twins' scenes, or the hard ones (many objects at several scales,
    thin structures, outlines, natural textures: `splitlab.data.generators.hard_scenes`)."""
    p.add_argument(
        "--difficulty",
        choices=("default", "hard"),
        default="default",
        help="default scenes, or hard ones (many objects, thin structures, natural textures; docs/hard_twins.md)",
    )


def add_range(p: argparse.ArgumentParser, option: str, kind: type | Callable[[str], Any], help_: str) -> None:
    """An optional ``LO HI`` pair (unset: the generator's default range)."""
    p.add_argument(option, type=kind, nargs=2, metavar=("LO", "HI"), help=help_)


def add_shapes(kinds: argparse._SubParsersAction) -> None:
    """``splitlab data shapes``: the classification set (`splitlab.data.generators.shapes`)."""
    shapes = kinds.add_parser(
        "shapes", help="ImageFolder (or HF) classification set whose class lives in fine detail"
    )
    add_written(shapes, 64, (600, "training images per class"), (150, "validation images per class"))
    shapes.add_argument("--test", type=positive_int, default=150, help="test images per class")
    shapes.add_argument("--format", choices=("imagefolder", "hf"), default="imagefolder")
    shapes.add_argument("--detail", type=positive_int, default=2, help="pattern feature width in pixels")
    shapes.add_argument(
        "--background",
        choices=("busy", "flat"),
        default="busy",
        help="busy texture (entropy points away from the object) or one plain colour (entropy is the right cue)",
    )
    add_difficulty(shapes)


def add_vocabulary(kinds: argparse._SubParsersAction) -> None:
    """``splitlab data vqa-vocab``: the word list of any VQAv2-layout folder (`vocabulary`)."""
    vocab = kinds.add_parser(
        "vqa-vocab", help="vocab.json (a word-level tokenizer's words) of any VQAv2-layout folder"
    )
    vocab.add_argument("root", help="the folder with the official questions (and annotations) files")
    vocab.add_argument(
        "--splits", nargs="+", default=["train2014", "val2014"], help="question splits to read"
    )
    vocab.add_argument(
        "--prompt", default=None, help="the prompt template, whose words go in too (default LLaVA's)"
    )
    vocab.add_argument("--out", default=None, help="where to write (default ROOT/vocab.json)")


def add_vqa(kinds: argparse._SubParsersAction) -> None:
    """``splitlab data vqa``: VQAv2-layout scenes (`splitlab.data.generators.vqa_scenes`); the scene
    options left unset keep the generator's defaults."""
    vqa = kinds.add_parser("vqa", help="VQAv2-layout questions on coloured, patterned squares")
    add_written(vqa, 128, (300, "training images (3-4 questions each)"), (80, "validation images"))
    vqa.add_argument("--format", choices=("official", "hf"), default="official")
    add_range(
        vqa, "--square", float, "the squares' side range as fractions of the image side (default 0.125 0.2)"
    )
    vqa.add_argument("--shade", type=float, help="pattern contrast: base colour ± shade (default 0.15)")
    vqa.add_argument(
        "--patterned",
        choices=("each", "one"),
        default="each",
        help="which squares carry a pattern: each, or only the one asked about (the CI twin's data)",
    )
    vqa.add_argument(
        "--questions-per-scene",
        type=positive_int,
        help="the pattern question and N-1 coarse ones (default 3-4: pattern, colour, then 1-2 more)",
    )
    vqa.add_argument(
        "--shape",
        choices=("square", "circle", "triangle", "diamond"),
        help="every object's shape, named by the questions (default square)",
    )
    vqa.add_argument(
        "--patterns",
        nargs="+",
        choices=("hstripes", "vstripes", "checks", "rising", "falling", "zigzag"),
        help="the pattern set, 2 or more (default hstripes vstripes checks; rising/falling are diagonals)",
    )
    add_range(vqa, "--objects", positive_int, "objects per scene, 2 <= LO <= HI <= 4 (default 2 3)")
    vqa.add_argument(
        "--background",
        choices=("busy", "flat", "noise"),
        help="busy blocks (default), one flat colour, or per-pixel noise",
    )


def vocabulary(args: argparse.Namespace) -> int:
    """``splitlab data vqa-vocab ROOT``: the word list of a VQAv2-layout folder's questions and answers."""
    from splitlab.data.vqa import write_vocabulary
    from splitlab.heads.vqa import PROMPT

    path = write_vocabulary(args.root, args.splits, extra=args.prompt or PROMPT, out=args.out)
    print(f"wrote {path} ({len(json.loads(path.read_text()))} words)")
    return 0


def main(args: argparse.Namespace) -> int:
    import importlib

    if args.kind == "vqa-vocab":
        return vocabulary(args)

    module, name, written = GENERATORS[args.kind]
    generate = getattr(importlib.import_module(module), name)
    # every option of the subcommand is the generator's keyword argument of the same name; unset
    # optional ones keep the generator's defaults
    options = {k: v for k, v in vars(args).items() if k not in ("command", "kind") and v is not None}
    if "format" in options:
        options["fmt"] = options.pop("format")
    for key in ("square", "patterns", "objects"):  # lists from argparse, tuples for the generator
        if key in options:
            options[key] = tuple(options[key])
    target = Path(options["out"])
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(
            f"--out {target}: {'holds files already' if target.is_dir() else 'is a file'}; give a new folder "
            "(a dataset is written whole into a folder of its own)"
        )
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # an earlier run's, stopped half-way
    try:  # written aside and moved in whole: a failed or stopped run leaves no partial dataset
        generate(**{**options, "out": partial})
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():
        target.rmdir()
    partial.rename(target)
    print(f"wrote {written.format(**options)} to {target}")
    return 0


GENERATORS = {  # kind -> module, generator, what it writes
    "shapes": ("splitlab.data.generators.shapes", "generate_shapes", "{fmt} dataset"),
    "vqa": (
        "splitlab.data.generators.vqa_scenes",
        "generate_vqa",
        "VQAv2-layout ({fmt}) dataset and vocab.json",
    ),
    "ade20k": ("splitlab.data.generators.dense_scenes", "generate_ade20k", "ade20k-format dataset"),
    "coco": ("splitlab.data.generators.dense_scenes", "generate_coco", "coco-format dataset"),
}
