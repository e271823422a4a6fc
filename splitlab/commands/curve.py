"""``splitlab curve RUN_DIR``: the accuracy-tokens trade-off of a trained run, one policy, several budgets.

For each budget the learned policy (budget-conditioned runs serve any budget of their range
without retraining) and the random and entropy baselines at its realised fraction (and the oracle
layout where the run's data has annotations), plus the uniform grid: one ``validate`` of the run's own config and checkpoint through the LightningCLI,
written as ``curve.json`` and ``curve.png``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from splitlab.commands.arguments import command_parser, fraction_list, lightning_overrides
from splitlab.report import curve_record, plot_curve
from splitlab.tasks.settings import ORACLES

# its line in splitlab --help
SUMMARY = "metric and speed against token fraction for a trained run (learned, random, entropy, uniform)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "curve", SUMMARY, __doc__)
    p.add_argument("run_dir", help="what a fit leaves: config.yaml and checkpoints/last.ckpt")
    p.add_argument(
        "--eval-budgets",
        type=fraction_list,
        default=None,
        help="budgets, e.g. 0.3,0.5,0.7 (default: the trained range's ends and the run's target; a policy "
        "trained for one budget: that budget)",
    )
    p.add_argument("--ckpt", default=None, help="checkpoint (default RUN_DIR/checkpoints/last.ckpt)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/curve)")
    p.epilog = (
        "Further --data.* / --model.* / --trainer.* arguments override the run's config (e.g. the data root)."
    )


def curve_arguments(args: argparse.Namespace, overrides: Sequence[str] = ()) -> tuple[list[str], Path]:
    """The ``validate`` arguments that evaluate every budget at once, and the output folder."""
    run = Path(args.run_dir)
    config, ckpt = run / "config.yaml", Path(args.ckpt) if args.ckpt else run / "checkpoints" / "last.ckpt"
    for path, what in (
        (config, "RUN_DIR/config.yaml"),
        (ckpt, "--ckpt" if args.ckpt else "RUN_DIR/checkpoints/last.ckpt"),
    ):
        if not path.is_file():
            raise FileNotFoundError(f"{what}: {path} not found (RUN_DIR is the folder a fit wrote)")
    overrides = lightning_overrides(overrides)
    args.eval_budgets = _check_trained_budgets(config, args.eval_budgets)
    evaluated = (_model_settings(config).get("evaluation") or {}).get("eval_baselines", [])
    # the oracles where the run evaluated them (``oracle``: its data has annotations)
    baselines = ["uniform", "random", "entropy", *(b for b in ORACLES if b in evaluated)]
    out = Path(args.out) if args.out else run / "curve"
    first, *rest = args.eval_budgets
    argv = [
        "validate",
        f"--config={config}",
        f"--ckpt_path={ckpt}",
        f"--model.init_args.budget={first}",
        f"--model.init_args.evaluation.eval_budgets={json.dumps(rest)}",
        f"--model.init_args.evaluation.eval_baselines={json.dumps(baselines)}",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={out}",
        *overrides,
    ]
    return argv, out


def _model_settings(config: Path) -> dict:
    """The model's ``init_args`` in a run's ``config.yaml``."""
    import yaml

    return (yaml.safe_load(config.read_text()) or {}).get("model", {}).get("init_args", {}) or {}


def _check_trained_budgets(config: Path, eval_budgets: Sequence[float] | None) -> list[float]:
    """The budgets to evaluate (by default those the run's policy serves), refusing, before loading
    anything, budgets it was not trained for."""
    settings = _model_settings(config)
    budgets, target = settings.get("budget_range"), settings.get("budget")
    if eval_budgets is None:
        if budgets is None:
            return [float(target if target is not None else 0.5)]
        return sorted({float(min(budgets)), float(target), float(max(budgets))})
    if budgets is None:
        others = target is None or any(abs(f - float(target)) > 1e-6 for f in eval_budgets)
        if others:
            raise ValueError(
                f"--eval-budgets {','.join(f'{f:g}' for f in eval_budgets)}: {config}'s policy was trained for "
                f"budget {target} only (budget_range: null); a curve needs a budget-conditioned run "
                "(model.init_args.budget_range: [lowest, highest])"
            )
        return list(eval_budgets)
    lo, hi = min(budgets), max(budgets)
    outside = [f for f in eval_budgets if not lo - 1e-6 <= f <= hi + 1e-6]
    if outside:
        raise ValueError(
            f"--eval-budgets: {', '.join(f'{f:g}' for f in outside)} outside the range the policy of {config} "
            f"was trained for (budget_range: [{lo:g}, {hi:g}])"
        )
    return list(eval_budgets)


def main(args: argparse.Namespace, overrides: Sequence[str] = ()) -> int:
    from splitlab.cli import lightning_main

    argv, out = curve_arguments(args, overrides)
    lightning_main(argv)
    summary = json.loads((out / "summary.json").read_text())
    record = curve_record(summary, list(args.eval_budgets))
    (out / "curve.json").write_text(json.dumps(record, indent=2) + "\n")
    plot_curve(record, out / "curve.png")
    print(f"curve: {out / 'curve.json'}  picture: {out / 'curve.png'}")
    return 0
