"""The ADE20K recipe's CI twin end to end: `lightning fit --config tasks/ade20k.yaml --config
configs/ci/ade20k.yaml` after a dense backbone stage, then `validate` and `test` from the checkpoint,
on generated scenes (`DenseTwinChecks`), and how its learned layouts compare."""

from __future__ import annotations

import pytest

from splitlab.commands.demo import run_pipeline
from tests.pipelines.dense_twin import DenseTwinChecks


class TestSegmentationTwin(DenseTwinChecks):
    task, metric, uniform_floor, rerun = "ade20k", "miou", 0.6, "validate"

    def test_segmentation_regression(self, run, measured) -> None:
        _, record = run
        learned, random, entropy = (record["policies"][p] for p in ("learned", "random", "entropy"))
        measured(  # the numbers belong in the CI log
            f"ade20k CI: learned mIoU {learned['miou']:.3f} at fraction {learned['token_fraction_mean']:.3f}, "
            f"object fine coverage {learned['object_fine_coverage']:.3f} (boundary {learned['boundary_fine_coverage']:.3f}); "
            f"entropy coverage {entropy['object_fine_coverage']:.3f} at {entropy['token_fraction_mean']:.3f}; "
            f"random mIoU {random['miou']:.3f} at {random['token_fraction_mean']:.3f}"
        )
        assert learned["object_fine_coverage"] >= entropy["object_fine_coverage"] + 0.10
        assert learned["miou"] >= random["miou"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_the_segmentation_twin_meets_the_budget_across_seeds(tmp_path, seed, measured) -> None:
    record = run_pipeline(tmp_path / "ade20k", seed=seed, quiet=True, task="ade20k")
    learned = record["policies"]["learned"]
    measured(
        f"ade20k seed {seed}: learned {learned['metric']:.3f} at fraction {learned['token_fraction_mean']:.3f}"
    )
    assert abs(learned["token_fraction_mean"] - record["target_fraction"]) <= 0.03
