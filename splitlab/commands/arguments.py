"""argparse types shared by splitlab's commands: a bad value is one usage line that names the option."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

# what a tool that runs the LightningCLI passes on to it
LIGHTNING_OVERRIDES = ("--data.", "--model.", "--trainer.", "--seed_everything")


def positive_int(text: str) -> int:
    """An integer >= 1 (batch sizes, iterations, image counts)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def count(text: str) -> int:
    """An integer >= 0 (warm-up iterations)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def seed_value(text: str) -> int:
    """A random seed: an integer in [0, 2**32), the range NumPy and Lightning take."""
    value = _int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{value} is not a seed in [0, 2**32)")
    return value


def fraction(text: str) -> float:
    """A token fraction in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value:g} is not a token fraction in (0, 1]")
    return value


def fraction_list(text: str) -> list[float]:
    """``"0.3,0.5,0.7"`` -> ``[0.3, 0.5, 0.7]``."""
    values = [fraction(v) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one fraction, e.g. 0.3,0.5,0.7")
    return values


def positive_int_list(text: str) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]`` (batch sizes of a sweep)."""
    values = [positive_int(v) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one, e.g. 1,8,32,64")
    return values


def device_name(text: str) -> str:
    """A torch device (``cpu``, ``cuda``, ``cuda:1``, ``mps``); whether it is present is checked on use."""
    import torch

    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    return text


def output_file(text: str) -> str:
    """A file to write at the end of a command: its folder must be creatable now, not after the work."""
    from pathlib import Path

    folder = Path(text).expanduser().parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not writable")
    return text


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def add_file_reading(p: argparse.ArgumentParser) -> None:
    """The options of a command that runs a model on image files (predict, calibrate): how files are
    read (EXIF orientation, bit depth, batch, decoding workers) and on which device."""
    p.add_argument(
        "--exif-transpose",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read each file upright by its EXIF orientation, as phones' portrait photos need "
        "(default: as the model's data was read, on unless trained with data.exif_transpose=false); "
        "--no-exif-transpose reads the pixels as stored",
    )
    p.add_argument(
        "--high-depth",
        choices=("range", "dtype"),
        default=None,
        help="16-bit, 32-bit and float images: 'range' scales each by its own minimum and maximum, 'dtype' "
        "by its type's range (as an 8-bit file is read: a 16-bit twin of an 8-bit file reads alike) "
        "(default: as the model's data was read, data.high_depth, 'range' unless set)",
    )
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument(
        "--num-workers", type=int, default=min(4, max((os.cpu_count() or 1) - 1, 0)), help="decoding workers"
    )
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:1, ...")


def command_parser(
    sub: argparse._SubParsersAction, name: str, summary: str, doc: str
) -> argparse.ArgumentParser:
    """Subcommand ``name``: ``summary`` is its line in ``splitlab --help``, the first paragraph of its
    module docstring (``doc``) heads its own ``--help``, so the command is described once."""
    return sub.add_parser(name, help=summary, description=doc.split("\n\n")[0])


def add_model(p: argparse.ArgumentParser, inputs: str | None = None) -> None:
    """MODEL, for the commands that load a trained model (anything `splitlab.load` takes), and, given
    ``inputs`` (its help), the image files or folders it runs on."""
    p.add_argument("model", help="run folder, .ckpt, save_pretrained folder or Hugging Face Hub id")
    if inputs is not None:
        p.add_argument("inputs", nargs="+", help=inputs)


def file_reading(args: argparse.Namespace) -> dict[str, Any]:
    """The options `add_file_reading` added, checked, as the keyword arguments `splitlab.model`'s
    readers of files take (``splitlab.model.predict``, ``splitlab.model.calibrate``)."""
    if args.num_workers < 0:
        raise ValueError(f"--num-workers {args.num_workers}: must be 0 or more")
    return {
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "exif_transpose": args.exif_transpose,
        "high_depth": args.high_depth,
    }


def lightning_overrides(words: Sequence[str], prefixes: Sequence[str] = LIGHTNING_OVERRIDES) -> list[str]:
    """A tool's further words as LightningCLI overrides: ``--key value`` pairs joined as ``--key=value``
    (argparse hands the value over as a word of its own), anything but ``prefixes`` refused by name."""
    out: list[str] = []
    for word in words:
        if out and out[-1].startswith("--") and "=" not in out[-1] and not word.startswith("--"):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    bad = [o for o in out if not o.startswith(tuple(prefixes))]
    if bad:
        allowed = ", ".join(p + ("*" if p.endswith(".") else "") for p in prefixes)
        raise ValueError(f"unknown arguments {bad}: only {allowed} overrides are passed on")
    return out
