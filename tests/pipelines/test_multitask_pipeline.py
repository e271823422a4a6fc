"""The multi-task twin (`splitlab demo --task coco+ade20k`): one policy for the COCO and ADE20K twins'
heads, against random trained in the same pipeline (docs/reuse.md has the 3-seed table)."""

from __future__ import annotations

import pytest

from splitlab.commands.demo import run_pipeline

METRICS = {"coco": "coco/map", "ade20k": "ade20k/miou"}


@pytest.mark.slow  # two multi-task twins (~15 min); the multi-task mechanics run in make test
def test_the_multitask_policy_beats_random_on_both_tasks(tmp_path, measured) -> None:
    learned = run_pipeline(tmp_path / "multi", seed=0, quiet=True, task="coco+ade20k")
    random = run_pipeline(
        tmp_path / "random", seed=0, quiet=True, task="coco+ade20k", policy="random", reuse=tmp_path / "multi"
    )
    assert learned["trained_policy"] == "multitask" and random["trained_policy"] == "random"
    row, other = learned["policies"]["multitask"], random["policies"]["random"]
    assert abs(row["token_fraction_mean"] - learned["budget"]) <= 0.03
    assert abs(other["token_fraction_mean"] - random["budget"]) <= 0.03
    for task, metric in METRICS.items():
        measured(
            f"{task}: multi-task policy {row[metric]:.3f} at {row['token_fraction_mean']:.3f}, random trained "
            f"in the pipeline {other[metric]:.3f}, uniform {learned['policies']['uniform'][metric]:.3f}"
        )
        assert row[metric] >= other[metric] + 0.10
