"""The ADE20K recipe's CI twin end to end: `lightning fit --config tasks/ade20k.yaml --config
configs/ci/ade20k.yaml` after a dense backbone stage, then `validate` and `test` from the checkpoint,
on generated scenes (`DenseTwinChecks`), and how its learned layouts compare."""

from __future__ import annotations

import pytest

from splitlab.commands.demo import run_pipeline
from tests.pipelines.dense_twin import DenseTwinChecks


def check_segmentation(record: dict, seed: int, measured) -> None:
    """The segmentation twin's policy finds what the oracle finds (docs/oracle.md): at half the tokens
    the learned layout keeps 97% of the uniform grid's mIoU, beats random by 0.10 and entropy, and
    gives fine tokens to more object cells than entropy does."""
    learned, uniform, random, entropy, oracle = (
        record["policies"][p] for p in ("learned", "uniform", "random", "entropy", "oracle")
    )
    measured(  # the numbers belong in the CI log
        f"ade20k seed {seed}: learned mIoU {learned['miou']:.3f} at fraction {learned['token_fraction_mean']:.3f}, "
        f"object fine coverage {learned['object_fine_coverage']:.3f} (boundary {learned['boundary_fine_coverage']:.3f}); "
        f"uniform {uniform['miou']:.3f}, oracle {oracle['miou']:.3f}, random {random['miou']:.3f}, "
        f"entropy {entropy['miou']:.3f} (coverage {entropy['object_fine_coverage']:.3f})"
    )
    assert abs(learned["token_fraction_mean"] - record["budget"]) <= 0.03
    assert learned["miou"] >= 0.97 * uniform["miou"], (
        f"learned {learned['miou']:.3f}, uniform {uniform['miou']:.3f}"
    )
    assert learned["miou"] >= random["miou"] + 0.10 and learned["miou"] >= entropy["miou"]
    assert learned["object_fine_coverage"] >= entropy["object_fine_coverage"] + 0.10


class TestSegmentationTwin(DenseTwinChecks):
    task, metric, uniform_floor, rerun = "ade20k", "miou", 0.6, "validate"

    def test_segmentation_regression(self, run, measured) -> None:
        check_segmentation(run[1], 0, measured)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_the_segmentation_twin_meets_the_budget_across_seeds(tmp_path, seed, measured) -> None:
    check_segmentation(
        run_pipeline(tmp_path / "ade20k", seed=seed, quiet=True, task="ade20k"), seed, measured
    )
