"""``splitlab convert-checkpoint IN OUT``: a checkpoint you trust that holds more than weights, rewritten
as one that every splitlab reader accepts.

splitlab reads checkpoints with ``weights_only=True`` and refuses a file that holds other objects
(unpickling them would run whatever they name). This command is the one place that unpickles a
file in full (``weights_only=False``), so run it only on a file whose origin you trust: it writes
OUT with the weights and the settings as plain values (dataclasses and namespaces as dicts, paths
as strings), says what it left out, and reads OUT back as the other commands will.
"""

from __future__ import annotations

import argparse

from splitlab.commands.arguments import command_parser

# its line in splitlab --help
SUMMARY = "rewrite a trusted checkpoint that holds more than weights as a weights-only one"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "convert-checkpoint", SUMMARY, __doc__)
    p.add_argument("checkpoint", help="the .ckpt to convert (unpickled in full: only a file you trust)")
    p.add_argument("out", help="the .ckpt to write (a new file)")


def main(args: argparse.Namespace) -> int:
    import warnings

    from splitlab.checkpoint import convert_checkpoint

    dropped = convert_checkpoint(args.checkpoint, args.out)
    if dropped:
        shown = "; ".join(dropped[:5]) + (f"; ... ({len(dropped)} in all)" if len(dropped) > 5 else "")
        warnings.warn(
            f"convert-checkpoint left out what is neither weights nor a plain value: {shown}", stacklevel=1
        )
    print(f"wrote {args.out}: the weights and plain settings of {args.checkpoint}, readable weights-only")
    return 0
