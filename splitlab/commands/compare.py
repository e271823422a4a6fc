"""``splitlab compare RUN [RUN ...]``: trained policies side by side (SPLIT, APT-trained, random-trained).

Each run is what a ``fit`` (or ``splitlab demo``) leaves: its ``summary.json`` names the policy it
trained (``trained_policy``) and that policy's row is the trained one; the first run's uniform
row is the uniform grid. One table (printed, ``compare.md``), ``compare.json`` and ``compare.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from splitlab.report import compare_record, format_compare, plot_compare


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="trained policies side by side (SPLIT vs APT-trained vs random-trained)"
    )
    p.add_argument("runs", nargs="+", help="run folders, each with a summary.json")
    p.add_argument("--out", default=None, help="output folder (default: the first run's compare/)")


def main(args: argparse.Namespace) -> int:
    summaries = {}
    for run in args.runs:
        path = Path(run) / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: give the folders that fit or splitlab demo wrote")
        try:
            summaries[run] = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(
                f"{path} is not readable JSON ({err}): rerun the fit or demo that wrote it"
            ) from None
    record = compare_record(summaries)
    out = Path(args.out) if args.out else Path(args.runs[0]) / "compare"
    out.mkdir(parents=True, exist_ok=True)
    table = format_compare(record)
    (out / "compare.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "compare.md").write_text(table + "\n")
    plot_compare(record, out / "compare.png")
    print(table)
    print(f"\ncompare: {out / 'compare.json'}  picture: {out / 'compare.png'}")
    return 0
