"""The run's report: `summary.json` (one row per evaluated layout policy) and the comparison table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def summary_record(
    task: str,
    metric: str,
    target_fraction: float,
    lam: float,
    policies: dict[str, dict[str, float]],
    stage: str,
) -> dict[str, Any]:
    """The content of `summary.json`: one row per evaluated layout policy."""
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
        "target_fraction": target_fraction,
        "lambda": lam,
        "policies": rows,
    }


def write_summary(record: dict[str, Any], directory: str | Path) -> Path:
    """Write `summary.json` (NaN as null, so any JSON reader takes it)."""
    path = Path(directory) / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = json.loads(json.dumps(record, allow_nan=True).replace("NaN", "null"))
    path.write_text(json.dumps(clean, indent=2) + "\n")
    return path


def format_table(record: dict[str, Any]) -> str:
    """The comparison as a fixed-width text table."""
    metric = record["metric"]
    header = f"{'policy':<10} {metric:>10} {'fraction':>10} {'± std':>8} {'img/s':>10}"
    lines = [
        f"{record['task']} ({record['stage']}): target fraction {record['target_fraction']:.2f}, lambda {record['lambda']:.4f}",
        header,
        "-" * len(header),
    ]
    for name, row in record["policies"].items():
        value = row["metric"]
        shown = "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
        lines.append(
            f"{name:<10} {shown:>10} {row['token_fraction_mean']:>10.3f} {row['token_fraction_std']:>8.3f} "
            f"{row['images_per_second']:>10.1f}"
        )
    return "\n".join(lines)
