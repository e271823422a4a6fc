"""``splitlab``: the LightningCLI subcommands (fit, validate, test, predict) plus splitlab's own tools.

``splitlab data | demo | bench | curve | compare | predict | export | calibrate | convert-checkpoint`` are
argparse commands in this room; everything else goes to `splitlab.cli` (the same LightningCLI as the
``lightning`` command).
``splitlab predict MODEL INPUT...`` runs a trained model on files; given a recipe (``--config``,
``--ckpt_path``, ``--model.*`` ...) it is LightningCLI's ``predict``, as ``lightning predict`` is.
Nothing imports back here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from splitlab.cli import main as lightning_main
from splitlab.cli import reporting_errors
from splitlab.commands import bench, calibrate, compare, convert, curve, data, demo, export, predict

TOOLS = {
    "data": data,
    "demo": demo,
    "bench": bench,
    "curve": curve,
    "compare": compare,
    "predict": predict,
    "export": export,
    "calibrate": calibrate,
    "convert-checkpoint": convert,
}
LIGHTNING_ARGUMENTS = ("-c", "--config", "--ckpt_path", "--trainer", "--model", "--data", "--seed_everything")
OVERRIDABLE = {"curve"}  # tools that pass further --data.* / --model.* / --trainer.* arguments on


def run(argv: Sequence[str]) -> int:
    """Dispatch ``splitlab data|demo|bench ...`` and return the exit code."""
    parser = argparse.ArgumentParser(
        prog="splitlab", description="splitlab tools (fit/validate/test/predict: the LightningCLI)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in TOOLS.values():
        module.add_parser(sub)
    args, extra = parser.parse_known_args(list(argv))
    if args.command in OVERRIDABLE:
        return TOOLS[args.command].main(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return TOOLS[args.command].main(args)


def lightning_predict(argv: Sequence[str]) -> bool:
    """Whether ``splitlab predict ...`` names a recipe: LightningCLI's predict, not the files tool."""
    return any(a.split("=")[0].split(".")[0] in LIGHTNING_ARGUMENTS for a in argv[1:])


def main(argv: Sequence[str] | None = None) -> None:
    """``splitlab COMMAND ...``: a LightningCLI subcommand (fit, validate, test, predict) or one of `TOOLS`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS and not (argv[0] == "predict" and lightning_predict(argv)):
        sys.exit(reporting_errors(lambda: run(argv)))
    lightning_main(argv)
