"""`Progress`: the one writer of the stage and of the PPO updates run, and what each stage trains."""

from __future__ import annotations

import pytest

from splitlab.training import STAGES, Progress


def test_progress_enters_known_stages_only_and_counts_ppo_updates() -> None:
    progress = Progress()
    assert progress.record() == {"stage": "warm_start", "ppo_steps": 0}  # before any schedule runs
    progress.enter("ppo")
    progress.count_ppo_step()
    progress.count_ppo_step()
    assert progress.record() == {"stage": "ppo", "ppo_steps": 2}
    with pytest.raises(ValueError, match=r"stage='rl': expected one of \('dense', 'warm_start', 'ppo'\)"):
        progress.enter("rl")
    assert STAGES == ("dense", "warm_start", "ppo")


def test_a_restored_record_and_one_from_before_the_count() -> None:
    progress = Progress()
    assert progress.restore({"stage": "dense", "ppo_steps": 0}) and progress.stage == "dense"
    assert progress.restore({"stage": "ppo"}) and progress.ppo_steps == 1  # PPO ran, uncounted
    assert progress.restore({"stage": "warm_start"}) and progress.ppo_steps == 0
    assert not Progress().restore({})  # a checkpoint that records no stage


@pytest.mark.parametrize(
    ("stage", "learned", "fixed", "transferred", "frozen_warm_start"),
    [
        ("dense", False, False, False, False),
        ("warm_start", True, False, False, True),
        ("ppo", True, False, True, True),
    ],
)
def test_what_each_stage_trains(stage, learned, fixed, transferred, frozen_warm_start) -> None:
    progress = Progress(stage)
    assert progress.policy_trains("learned") is learned
    assert progress.policy_trains("entropy") is fixed
    assert progress.policy_trains("transferred", transfer_finetune=True) is transferred
    assert progress.policy_trains("transferred") is False
    assert progress.task_frozen() is (stage == "ppo")
    assert progress.task_frozen(finetune=False) is frozen_warm_start
