"""The run's report: `summary.json` (one row per evaluated layout policy), the comparison table, and
the accuracy-tokens trade-off curve (`curve.json`, `curve.png`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def summary_record(
    task: str,
    metric: str,
    budget: float,
    lam: float,
    policies: dict[str, dict[str, float]],
    stage: str,
    trained_policy: str = "learned",
    columns: list[str] | None = None,
) -> dict[str, Any]:
    """The content of `summary.json`: one row per evaluated layout policy; the row named
    ``trained_policy`` is the policy this run trained (the others share its backbone); ``columns``:
    further metrics of the rows the table shows (a multi-task run's per-task metrics)."""
    rows = {}
    for name, values in policies.items():
        rows[name] = {
            "metric": values.get(metric, float("nan")),
            "token_fraction_mean": values["token_fraction_mean"],
            "token_fraction_std": values["token_fraction_std"],
            "images_per_second": values["images_per_second"],
            **{
                k: v
                for k, v in values.items()
                if k not in ("token_fraction_mean", "token_fraction_std", "images_per_second")
            },
        }
    return {
        "task": task,
        "metric": metric,
        "stage": stage,
        "trained_policy": trained_policy,
        "budget": budget,
        "lambda": lam,
        "policies": rows,
        **({"columns": list(columns)} if columns else {}),
    }


def finite_or_null(value: Any) -> Any:
    """``value`` with every NaN or infinity (at any depth) as None, which strict JSON readers take."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def write_summary(record: dict[str, Any], directory: str | Path) -> Path:
    """Write `summary.json` (NaN and infinities as null, so any JSON reader takes it)."""
    path = Path(directory) / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite_or_null(record), indent=2, allow_nan=False) + "\n")
    return path


def format_table(record: dict[str, Any]) -> str:
    """The comparison as a fixed-width text table."""
    metric = record["metric"]
    columns = record.get("columns", [])
    width = max([10, *(len(c) for c in columns)])
    extra = "".join(f" {c:>{width}}" for c in columns)
    names = max([14, *(len(name) for name in record["policies"])])  # loss_oracle@0.3 is 15 wide
    header = f"{'policy':<{names}} {metric:>10}{extra} {'fraction':>10} {'± std':>8} {'img/s':>10}"
    trained = record.get("trained_policy", "learned")
    lines = [
        f"{record['task']} ({record['stage']}, trained policy: {trained}): budget "
        f"{record['budget']:.2f}, lambda {record['lambda']:.4f}",
        header,
        "-" * len(header),
    ]

    def shown(value: Any, spec: str) -> str:
        return (
            "n/a"
            if value is None or (isinstance(value, float) and math.isnan(value))
            else format(value, spec)
        )

    for name, row in record["policies"].items():
        values = "".join(f" {shown(row.get(c), '.4f'):>{width}}" for c in columns)
        lines.append(
            f"{name:<{names}} {shown(row['metric'], '.4f'):>10}{values} {shown(row['token_fraction_mean'], '.3f'):>10} "
            f"{shown(row['token_fraction_std'], '.3f'):>8} {shown(row['images_per_second'], '.1f'):>10}"
        )
    return "\n".join(lines)


CURVE_POLICIES = (
    "learned",
    "transferred",
    "multitask",
    "random",
    "entropy",
    "oracle",
    "loss_oracle",
    "fidelity_oracle",
    "uniform",
)  # oracle: where the data has annotations; loss_oracle, fidelity_oracle: where the run evaluated them
CURVE_KEYS = ("metric", "token_fraction_mean", "token_fraction_max", "images_per_second")


def budget_row(name: str, budget: float, first: float) -> str:
    """The summary row of policy ``name`` evaluated at ``budget`` (the first budget has no suffix)."""
    return name if name == "uniform" or budget == first else f"{name}@{budget:g}"


def curve_record(summary: dict[str, Any], budgets: list[float]) -> dict[str, Any]:
    """`curve.json` from a summary evaluated at ``budgets`` (``budget`` first, then ``eval_budgets``)."""
    points = []
    for budget in budgets:
        policies = {}
        for name in CURVE_POLICIES:
            row = summary["policies"].get(budget_row(name, budget, budgets[0]))
            if row is not None:
                policies[name] = {k: row.get(k) for k in CURVE_KEYS}
        points.append({"target": budget, "policies": policies})
    return {"task": summary["task"], "metric": summary["metric"], "points": points}


def plot_curve(record: dict[str, Any], path: str | Path) -> Path:
    """Metric and images/s against the realised token fraction, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (quality, speed) = plt.subplots(1, 2, figsize=(10, 4))
    for name in CURVE_POLICIES:
        rows = [p["policies"][name] for p in record["points"] if name in p["policies"]]
        if not rows:
            continue
        x = [r["token_fraction_mean"] for r in rows]
        style = {"marker": "o", "linestyle": "none" if name == "uniform" else "-", "label": name}
        quality.plot(x, [r["metric"] for r in rows], **style)
        speed.plot(x, [r["images_per_second"] for r in rows], **style)
    quality.set(xlabel="realised token fraction", ylabel=record["metric"], title=record["task"])
    speed.set(xlabel="realised token fraction", ylabel="images / s", title="throughput")
    for ax in (quality, speed):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


MATCHED = 0.03  # how far a trained row's realised fraction may sit from the target in `compare`


def metric_key(summary: dict[str, Any], task: str, metric: str) -> str | None:
    """Where ``summary``'s rows hold ``metric`` of ``task``: ``metric`` for a run of that task; for a
    multi-task run, its one column of that metric (``coco/map``); None where it has none."""
    if summary["task"] == task and summary["metric"] == metric:
        return "metric"
    columns = [c for c in summary.get("columns", []) if c.rpartition("/")[2] == metric]
    return columns[0] if len(columns) == 1 else None


def compare_record(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Trained policies side by side at one budget: per run its trained row; the oracle layout (where
    the data has annotations) and the uniform grid from the first run. A multi-task run beside runs
    of one of its tasks shows that task's metric (`metric_key`). Runs of another task or budget are
    refused; a row whose realised fraction misses the
    budget by more than `MATCHED` is listed in ``unmatched`` (the table says so under it)."""
    for run, summary in summaries.items():
        keys = ("task", "metric", "budget", "policies")
        lacking = [k for k in keys if k not in summary] if isinstance(summary, dict) else list(keys)
        if lacking or not isinstance(summary["budget"], (int, float)):
            raise ValueError(
                f"{run}/summary.json has no {lacking or ['budget as a number']}: not a summary "
                "that fit or splitlab demo wrote"
            )
    first = next(iter(summaries.values()))
    metric, target = first["metric"], first["budget"]
    rows, unmatched = [], []
    for run, summary in summaries.items():
        key = metric_key(summary, first["task"], metric)
        if key is None:
            raise ValueError(
                f"{run}: task {summary['task']!r} ({summary['metric']}), the first run is "
                f"{first['task']!r} ({metric}): compare runs of one task (a multi-task run beside "
                "runs of one of its tasks: put a run of that task first)"
            )
        if abs(summary["budget"] - target) > 1e-6:
            raise ValueError(
                f"{run}: trained for budget={summary['budget']:g}, the first run for "
                f"{target:g}: compare runs of one budget (or see each run's own curve)"
            )
        trained = summary.get("trained_policy", "learned")
        if trained not in summary["policies"]:
            raise ValueError(f"{run}: its summary has no row for its trained policy {trained!r}")
        row = summary["policies"][trained]
        values = {k: row.get(k) for k in CURVE_KEYS}
        values["metric"] = row.get(key)
        rows.append({"run": run, "trained_policy": trained, **values})
        realised = row.get("token_fraction_mean")
        if realised is not None and abs(realised - target) > MATCHED:
            unmatched.append(run)
    shown = (
        ("oracle", "(oracle layout)"),
        ("loss_oracle", "(loss oracle layout)"),
        ("fidelity_oracle", "(fidelity oracle layout)"),
        ("uniform", "(uniform grid)"),
    )
    for name, label in shown:  # the first run's
        row = first["policies"].get(name)
        if row is not None:
            rows.append({"run": label, "trained_policy": name, **{k: row.get(k) for k in CURVE_KEYS}})
    return {
        "task": first["task"],
        "metric": metric,
        "budget": target,
        "rows": rows,
        "unmatched": unmatched,
    }


def format_compare(record: dict[str, Any]) -> str:
    """The comparison as a markdown table."""
    metric = record["metric"]
    lines = [
        f"| run | trained policy | {metric} | fraction | max fraction | img/s |",
        "|---|---|---|---|---|---|",
    ]

    def number(value: Any, digits: int) -> str:  # summaries write NaN (nothing measured) as null
        return "n/a" if value is None else f"{value:.{digits}f}"

    for r in record["rows"]:
        lines.append(
            f"| {r['run']} | {r['trained_policy']} | {number(r['metric'], 4)} | "
            f"{number(r['token_fraction_mean'], 3)} | {number(r['token_fraction_max'], 3)} | "
            f"{number(r['images_per_second'], 1)} |"
        )
    for run in record.get("unmatched", []):
        lines.append(
            f"\nnote: {run} realises a token fraction more than {MATCHED} from the target "
            f"{record['budget']:g}: its row is not at the matched fraction"
        )
    return "\n".join(lines)


def plot_compare(record: dict[str, Any], path: str | Path) -> Path:
    """Each trained policy's metric at its realised token fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in record["rows"]:
        if r["metric"] is None or r["token_fraction_mean"] is None:  # nothing measured: table only
            continue
        ax.plot(r["token_fraction_mean"], r["metric"], "o", label=f"{r['trained_policy']} ({r['run']})")
    ax.set(
        xlabel="realised token fraction", ylabel=record["metric"], title=f"{record['task']}: trained policies"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
