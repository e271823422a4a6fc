"""``splitlab compare``: each run's trained row side by side, the first run's uniform grid, clear refusals."""

from __future__ import annotations

import json

import pytest

from splitlab.commands import run
from splitlab.report import summary_record, write_summary


def row(metric: float, fraction: float) -> dict[str, float]:
    return {
        "metric": metric,
        "token_fraction_mean": fraction,
        "token_fraction_max": fraction + 0.1,
        "token_fraction_std": 0.05,
        "images_per_second": 100.0,
    }


def summary(tmp_path, name: str, trained: str, rows: dict, task: str = "classification") -> str:
    record = summary_record(task, "top1", 0.5, 0.2, rows, "fit", trained_policy=trained)
    write_summary(record, tmp_path / name)
    return str(tmp_path / name)


def test_trained_rows_side_by_side(tmp_path, capsys) -> None:
    split = summary(
        tmp_path,
        "split",
        "learned",
        {"learned": row(0.97, 0.5), "uniform": row(0.99, 1.0), "entropy": row(0.5, 0.5)},
    )
    apt = summary(tmp_path, "apt", "entropy", {"entropy": row(0.27, 0.5), "uniform": row(0.70, 1.0)})
    nothing = summary(tmp_path, "empty", "random", {"random": row(float("nan"), 0.5)})
    assert run(["compare", split, apt, nothing, "--out", str(tmp_path / "cmp")]) == 0
    record = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [(r["run"], r["trained_policy"], r["metric"]) for r in record["rows"]] == [
        (split, "learned", 0.97),  # not the learned run's same-backbone entropy row
        (apt, "entropy", 0.27),
        (nothing, "random", None),  # NaN in summary.json is null
        ("(uniform grid)", "uniform", 0.99),  # the first run's
    ]
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| n/a |" in table and table in capsys.readouterr().out
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0


def test_compare_refuses_runs_it_cannot_line_up(tmp_path) -> None:
    split = summary(tmp_path, "split", "learned", {"learned": row(0.97, 0.5)})
    seg = summary(tmp_path, "seg", "learned", {"learned": row(0.8, 0.5)}, task="ade20k")
    with pytest.raises(ValueError, match="task 'ade20k' .*the first run is 'classification'"):
        run(["compare", split, seg])
    with pytest.raises(FileNotFoundError, match="summary.json not found"):
        run(["compare", split, str(tmp_path / "missing")])


def test_compare_refuses_unreadable_summaries_and_other_budgets(tmp_path, capsys) -> None:
    split = summary(tmp_path, "split", "learned", {"learned": row(0.97, 0.5)})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text('{"task": "classification", ')
    with pytest.raises(ValueError, match="broken/summary.json is not readable JSON"):
        run(["compare", split, str(broken)])
    (broken / "summary.json").write_text('{"task": "classification"}')
    with pytest.raises(ValueError, match=r"broken/summary.json has no \['metric', 'budget', 'policies'\]"):
        run(["compare", split, str(broken)])
    (broken / "summary.json").write_text("0.5")
    with pytest.raises(ValueError, match="broken/summary.json has no"):
        run(["compare", split, str(broken)])
    record = summary_record("classification", "top1", 0.3, 0.2, {"learned": row(0.9, 0.3)}, "fit")
    write_summary(record, tmp_path / "tight")
    with pytest.raises(ValueError, match="trained for budget=0.3, the first run for 0.5"):
        run(["compare", split, str(tmp_path / "tight")])


def test_compare_says_when_a_row_misses_the_matched_fraction(tmp_path, capsys) -> None:
    split = summary(tmp_path, "split", "learned", {"learned": row(0.97, 0.51)})
    loose = summary(tmp_path, "loose", "entropy", {"entropy": row(0.9, 0.62)})
    assert run(["compare", split, loose, "--out", str(tmp_path / "cmp")]) == 0
    record = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert record["unmatched"] == [loose]
    assert (
        f"note: {loose} realises a token fraction more than 0.03 from the target 0.5"
        in capsys.readouterr().out
    )


def test_a_multitask_run_shows_the_metric_of_the_first_runs_task(tmp_path) -> None:
    """A multi-task run beside a run of one of its tasks: its row gives that task's metric (its column)."""
    coco = summary_record("detection", "map", 0.5, 0.2, {"learned": row(0.64, 0.5)}, "fit")
    write_summary(coco, tmp_path / "coco")
    multi_row = {**row(0.78, 0.5), "coco/map": 0.66, "ade20k/miou": 0.91}
    multi = summary_record(
        "multitask",
        "mean",
        0.5,
        0.2,
        {"multitask": multi_row},
        "fit",
        "multitask",
        ["coco/map", "ade20k/miou"],
    )
    write_summary(multi, tmp_path / "multi")
    assert (
        run(["compare", str(tmp_path / "coco"), str(tmp_path / "multi"), "--out", str(tmp_path / "cmp")]) == 0
    )
    record = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [(r["trained_policy"], r["metric"]) for r in record["rows"]] == [
        ("learned", 0.64),
        ("multitask", 0.66),
    ]
    seg = summary_record("segmentation", "miou", 0.5, 0.2, {"learned": row(0.88, 0.5)}, "fit")
    write_summary(seg, tmp_path / "seg")
    record = run(["compare", str(tmp_path / "seg"), str(tmp_path / "multi"), "--out", str(tmp_path / "cmp2")])
    rows = json.loads((tmp_path / "cmp2" / "compare.json").read_text())["rows"]
    assert rows[1]["metric"] == 0.91
    with pytest.raises(ValueError, match="put a run of that task first"):
        run(["compare", str(tmp_path / "multi"), str(tmp_path / "coco")])
