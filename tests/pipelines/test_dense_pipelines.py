"""The dense recipes' CI twins end to end: `lightning fit --config tasks/<task>.yaml --config configs/ci/<task>.yaml`
after a dense backbone stage, then `validate` and `test` from the checkpoint, on generated data."""

from __future__ import annotations

import json

import pytest

from splitlab.cli import lightning_main
from splitlab.commands.demo import ci_recipe, run_pipeline
from tests.helpers import one_point_curve


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("dense")
    return {
        task: (root / task, run_pipeline(root / task, seed=0, quiet=True, task=task))
        for task in ("ade20k", "coco")
    }


def _row(record: dict, policy: str) -> dict:
    return record["policies"][policy]


@pytest.mark.parametrize(("task", "metric"), [("ade20k", "miou"), ("coco", "map")])
def test_fit_writes_a_summary(runs, task, metric) -> None:
    _, record = runs[task]
    assert record["metric"] == metric and record["stage"] == "fit" and record["lambda"] >= 0
    assert set(record["policies"]) == {"learned", "uniform", "random", "entropy"}
    learned = _row(record, "learned")
    assert abs(learned["token_fraction_mean"] - record["target_fraction"]) <= 0.03
    for baseline in ("random", "entropy"):  # compared at the learned layout's fraction
        assert abs(_row(record, baseline)["token_fraction_mean"] - learned["token_fraction_mean"]) <= 0.03
    uniform = _row(record, "uniform")
    assert uniform["token_fraction_mean"] == 1.0
    assert (
        uniform["metric"] > {"miou": 0.6, "map": 0.15}[metric]
    )  # the dense stage trained a working backbone
    assert learned["images_per_second"] > 0


@pytest.mark.parametrize("task", ["ade20k", "coco"])
@pytest.mark.parametrize("command", ["validate", "test"])
def test_validate_and_test_from_the_checkpoint(runs, task, command, tmp_path) -> None:
    out, record = runs[task]
    args = [
        *ci_recipe(task),
        f"--data.init_args.root={out / 'data'}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    args += [
        "--trainer.logger.init_args.name=",
        "--trainer.logger.init_args.version=",
        "--trainer.enable_progress_bar=false",
    ]
    lightning_main([command, *args, f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"])
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["stage"] == command and again["lambda"] == pytest.approx(record["lambda"])
    assert _row(again, "learned")["metric"] == pytest.approx(_row(record, "learned")["metric"], abs=1e-6)


@pytest.mark.parametrize("task", ["ade20k", "coco"])
def test_curve_of_a_dense_run(runs, task, tmp_path) -> None:
    """`splitlab curve` on a detection and a segmentation run (trained for one budget: its one point)."""
    out, record = runs[task]
    one_point_curve(out, tmp_path / "curve", record, tolerance=1e-6)


def test_segmentation_regression(runs, measured) -> None:
    _, record = runs["ade20k"]
    learned, random, entropy = (_row(record, p) for p in ("learned", "random", "entropy"))
    measured(  # the numbers belong in the CI log
        f"ade20k CI: learned mIoU {learned['miou']:.3f} at fraction {learned['token_fraction_mean']:.3f}, "
        f"object fine coverage {learned['object_fine_coverage']:.3f} (boundary {learned['boundary_fine_coverage']:.3f}); "
        f"entropy coverage {entropy['object_fine_coverage']:.3f} at {entropy['token_fraction_mean']:.3f}; "
        f"random mIoU {random['miou']:.3f} at {random['token_fraction_mean']:.3f}"
    )
    assert learned["object_fine_coverage"] >= entropy["object_fine_coverage"] + 0.10
    assert learned["miou"] >= random["miou"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["ade20k", "coco"])
@pytest.mark.parametrize("seed", [1, 2])
def test_dense_twins_meet_the_budget_across_seeds(tmp_path, task, seed, measured) -> None:
    record = run_pipeline(tmp_path / task, seed=seed, quiet=True, task=task)
    learned = _row(record, "learned")
    measured(  # the numbers belong in the CI log
        f"{task} seed {seed}: learned {learned['metric']:.3f} at fraction {learned['token_fraction_mean']:.3f}"
    )
    assert abs(learned["token_fraction_mean"] - record["target_fraction"]) <= 0.03
