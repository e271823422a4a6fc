"""`splitlab.report`: summaries any JSON reader takes, tables that show what is missing."""

from __future__ import annotations

import json

from splitlab.report import format_table, summary_record, write_summary


def test_non_finite_numbers_become_null_and_names_stay(tmp_path) -> None:
    rows = {
        "NaNet": {  # a name holding "NaN" is a name, not a number
            "metric": float("nan"),
            "token_fraction_mean": 0.5,
            "token_fraction_std": float("inf"),
            "images_per_second": float("-inf"),
        }
    }
    record = summary_record("classification", "top1", 0.5, 0.2, rows, "fit")
    path = write_summary(record, tmp_path)
    saved = json.loads(path.read_text(), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    row = saved["policies"]["NaNet"]
    assert (row["metric"], row["token_fraction_std"], row["images_per_second"]) == (None, None, None)
    table = format_table(saved)  # a summary read back: its nulls show as n/a
    assert table.splitlines()[-1].split() == ["NaNet", "n/a", "0.500", "n/a", "n/a"]
