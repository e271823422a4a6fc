"""A policy reused across the dense twins (docs/reuse.md): the COCO twin's policy deployed on ADE20K
and the ADE20K twin's on COCO, frozen, each run fine-tuning its own backbone on the layouts."""

from __future__ import annotations

import pytest

from splitlab.commands.demo import run_pipeline

TASKS = {"coco": "map", "ade20k": "miou"}


@pytest.mark.slow  # two twins and two transfers (~7 min): the transfer mechanics run in make test
def test_a_transferred_policy_beats_random_on_both_dense_twins(tmp_path, measured) -> None:
    own = {task: run_pipeline(tmp_path / task, seed=0, quiet=True, task=task) for task in TASKS}
    for task, other in (("ade20k", "coco"), ("coco", "ade20k")):
        record = run_pipeline(
            tmp_path / f"{task}-from-{other}",
            seed=0,
            quiet=True,
            task=task,
            policy="transferred",
            reuse=tmp_path / task,
            extra=[f"--model.init_args.policy_options.policy_checkpoint={tmp_path / other}"],
        )
        metric = TASKS[task]
        transferred, random = record["policies"]["transferred"], record["policies"]["random"]
        learned = own[task]["policies"]["learned"]
        measured(
            f"{task} from {other}: transferred {transferred[metric]:.3f} at {transferred['token_fraction_mean']:.3f}, "
            f"random {random[metric]:.3f}, the task's own learned {learned[metric]:.3f}"
        )
        assert record["trained_policy"] == "transferred"
        assert abs(transferred["token_fraction_mean"] - record["budget"]) <= 0.03
        assert transferred[metric] >= random[metric] + 0.10
