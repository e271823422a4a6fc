"""What every dense recipe's CI twin is checked for, once: a test file subclasses `DenseTwinChecks` with
its task (one file per task, so that `make test`'s two workers run the twins side by side)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitlab.cli import lightning_main
from splitlab.commands.demo import run_pipeline
from tests.helpers import one_point_curve, twin_configs


class DenseTwinChecks:
    """The twin's run (`splitlab demo --task <task>`'s steps, seed 0: once per class), its fit summary,
    `validate` or `test` from its checkpoint, and `splitlab curve` on it."""

    task: str
    metric: str
    uniform_floor: float  # the dense stage trained a working backbone: the uniform grid scores above it
    rerun: str  # validate or test (one evaluation path: each twin reruns one, together they run both)

    @pytest.fixture(scope="class")
    def run(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
        out = tmp_path_factory.mktemp("dense") / self.task
        return out, run_pipeline(out, seed=0, quiet=True, task=self.task)

    def test_fit_writes_a_summary(self, run) -> None:
        record = run[1]
        assert record["metric"] == self.metric and record["stage"] == "fit" and record["lambda"] >= 0
        assert set(record["policies"]) == {"learned", "uniform", "random", "entropy", "oracle", "loss_oracle"}
        learned, uniform = record["policies"]["learned"], record["policies"]["uniform"]
        assert abs(learned["token_fraction_mean"] - record["budget"]) <= 0.03
        for baseline in ("random", "entropy", "oracle"):  # compared at the learned layout's fraction
            fraction = record["policies"][baseline]["token_fraction_mean"]
            assert abs(fraction - learned["token_fraction_mean"]) <= 0.03
        assert uniform["token_fraction_mean"] == 1.0 and uniform["metric"] > self.uniform_floor
        assert learned["images_per_second"] > 0

    def test_a_rerun_from_the_checkpoint_scores_as_the_fit_did(self, run, tmp_path) -> None:
        """The learned row alone: every row took the segmentation twin's rerun 26 s of an idle 22-minute
        `make test`, the learned row 8 s on a busy host where the curve's every row took 49 s (the loss
        oracle's most); `test_curve_of_the_run` reruns them all."""
        out, record, command = *run, self.rerun
        args = [
            *twin_configs(self.task),
            f"--data.init_args.root={out / 'data'}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.logger.init_args.name=",
            "--trainer.logger.init_args.version=",
            "--trainer.enable_progress_bar=false",
            "--model.init_args.evaluation.eval_baselines=[]",
        ]
        lightning_main([command, *args, f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"])
        again = json.loads((tmp_path / "summary.json").read_text())
        assert again["stage"] == command and again["lambda"] == pytest.approx(record["lambda"])
        assert set(again["policies"]) == {"learned"}
        learned, before = again["policies"]["learned"], record["policies"]["learned"]
        assert learned["metric"] == pytest.approx(before["metric"], abs=1e-6)

    def test_curve_of_the_run(self, run, tmp_path) -> None:
        """`splitlab curve` on a run trained for one budget: its one point."""
        out, record = run
        one_point_curve(out, tmp_path / "curve", record, tolerance=1e-6)
