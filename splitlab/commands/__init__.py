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
from splitlab.cli.renamed import renamed_option
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
OVERRIDABLE = {"curve", "demo"}  # tools that pass further --data.* / --model.* / --trainer.* arguments on


# LightningCLI's subcommands, as `splitlab --help` lists them beside the tools
LIGHTNING_COMMANDS = {
    "fit": "train a recipe: splitlab fit --config tasks/coco.yaml (dense, warm start, PPO as it says)",
    "validate": "evaluate a run: --config RUN/config.yaml --ckpt_path RUN/checkpoints/last.ckpt",
    "test": "evaluate a run on its test split (as validate)",
    "predict": "a recipe's predict step (--config ...); `splitlab predict MODEL FILES` runs a model on files",
}


def build_parser() -> argparse.ArgumentParser:
    """The tools' parser; its help lists every command, the LightningCLI's first."""
    lightning = "\n".join(f"  {name:<20}{text}" for name, text in LIGHTNING_COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="splitlab",
        description=f"Training (the LightningCLI; `splitlab COMMAND --help` for its settings):\n{lightning}",
        epilog="`splitlab COMMAND --help` says more of each.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, title="tools", metavar="COMMAND")
    for module in TOOLS.values():
        module.add_parser(sub)
    return parser


def run(argv: Sequence[str]) -> int:
    """Dispatch ``splitlab data|demo|bench ...`` and return the exit code."""
    parser = build_parser()
    hint = renamed_option(argv)
    if hint:
        parser.error(hint)
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
    if not argv or argv[0] in ("-h", "--help"):  # every command, not only the LightningCLI's four
        build_parser().print_help(sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    if argv and argv[0] in TOOLS and not (argv[0] == "predict" and lightning_predict(argv)):
        sys.exit(reporting_errors(lambda: run(argv)))
    lightning_main(argv)
