"""The hard twins (`splitlab demo --difficulty hard`, configs/ci/*_hard.yaml; docs/hard_twins.md): a
short fit on a few hard scenes keeps the generator and the thin-structure column honest in `make
test`; the full twins, `slow`, check that the scenes still tell policies apart at budget 0.45."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitlab.commands.demo import HARD_TWINS, run_pipeline
from splitlab.data import generate_ade20k


def test_a_short_hard_segmentation_fit(tmp_path: Path) -> None:
    """Both stages of the ADE20K hard twin on 16 training and 8 validation scenes, one batch an epoch:
    the summary has the thin-structure column, the uniform grid covers every thin cell, the oracle
    covers more of them than random splits at the same fraction (a policy trained this briefly does
    not meet the budget yet: the baselines follow its fraction)."""
    out = tmp_path / "hard"
    generate_ade20k(out / "data", train=16, val=8, seed=0, difficulty="hard")
    made = {"task": "ade20k", "seed": 0, "background": "busy", "difficulty": "hard"}
    (out / "data" / ".complete").write_text(json.dumps(made))
    record = run_pipeline(
        out, seed=0, quiet=True, task="ade20k", difficulty="hard", extra=["--data.init_args.batch_size=8"]
    )
    assert record["budget"] == 0.45 and "thin_fine_coverage" in record["columns"]
    policies = record["policies"]
    assert {"learned", "uniform", "random", "oracle"} <= set(policies)
    assert policies["uniform"]["thin_fine_coverage"] == 1.0
    learned = policies["learned"]["token_fraction_mean"]  # a few steps: not yet at the budget
    for baseline in ("oracle", "random"):  # compared at the learned layout's fraction
        assert abs(policies[baseline]["token_fraction_mean"] - learned) <= 0.03
    assert policies["oracle"]["thin_fine_coverage"] > policies["random"]["thin_fine_coverage"] + 0.2


def test_hard_is_refused_where_there_is_no_hard_twin(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no hard twin of --task vqa"):
        run_pipeline(tmp_path / "v", task="vqa", difficulty="hard")


@pytest.mark.slow
@pytest.mark.parametrize(
    "task",
    [
        pytest.param(
            task,
            marks=pytest.mark.xfail(
                reason="seed 0: the oracle keeps 0.93-0.94 of uniform (docs/hard_twins.md)"
            )
            if task == "coco"
            else (),
        )
        for task in sorted(HARD_TWINS)
    ],
)
def test_the_hard_twin_tells_policies_apart(task: str, tmp_path: Path) -> None:
    """Seed 0 at budget 0.45: the oracle keeps >= 0.95 of the uniform grid's metric and random splits
    (evaluated on the same backbone) keep < 0.7 of it: room for a policy to win or lose."""
    record = run_pipeline(tmp_path / task, seed=0, quiet=True, task=task, difficulty="hard")
    policies = record["policies"]
    uniform = policies["uniform"]["metric"]
    assert policies["oracle"]["metric"] >= 0.95 * uniform
    assert policies["random"]["metric"] < 0.7 * uniform


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "seed"),
    [
        *(("ade20k", seed) for seed in (0, 1, 2)),
        ("coco", 0),
        ("coco", 1),
        pytest.param(
            "coco",
            2,
            marks=pytest.mark.xfail(
                reason="the oracle itself kept 0.921 of uniform on 2026-12-06 (0.976 the day before): "
                "at 0.45 the scenes' annotated cells do not all fit (docs/hard_twins.md)"
            ),
        ),
    ],
)
def test_the_learned_policy_keeps_the_uniform_grid_and_the_oracle_on_a_hard_dense_twin(
    task: str, seed: int, tmp_path: Path, measured
) -> None:
    """Issue 49's bars at budget 0.45 on each hard dense twin: the learned policy keeps >= 0.95 of the
    uniform grid's metric and >= 0.97 of the oracle's, and puts finest tokens on thin structures within
    0.05 of the oracle's share (docs/hard_twins.md, "Every policy at 0.3, 0.45 and 0.6")."""
    record = run_pipeline(tmp_path / task, seed=seed, quiet=True, task=task, difficulty="hard")
    p = record["policies"]
    learned, uniform, oracle = p["learned"], p["uniform"], p["oracle"]
    measured(
        f"hard {task}, seed {seed}: learned {learned['metric']:.3f} @{learned['token_fraction_mean']:.3f}, "
        f"uniform {uniform['metric']:.3f}, oracle {oracle['metric']:.3f}, thin coverage "
        f"{learned['thin_fine_coverage']:.3f} / {oracle['thin_fine_coverage']:.3f}"
    )
    assert learned["metric"] >= 0.95 * uniform["metric"]
    assert learned["metric"] >= 0.97 * oracle["metric"]
    assert learned["thin_fine_coverage"] >= oracle["thin_fine_coverage"] - 0.05
