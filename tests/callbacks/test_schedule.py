"""`SplitSchedule`: which stage each epoch is in, and the log line at each change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from splitlab.callbacks import SplitSchedule


def test_stage_of_each_epoch() -> None:
    sched = SplitSchedule(warm_start_epochs=2, rl_epochs=3, dense_epochs=1)
    assert [sched.stage_at(e) for e in range(7)] == [
        "dense",
        "warm_start",
        "warm_start",
        "ppo",
        "ppo",
        "ppo",
        "ppo",
    ]
    assert SplitSchedule(0, 0, 2).stage_at(5) == "dense"
    with pytest.raises(ValueError, match="rl_epochs=-1 must be >= 0"):
        SplitSchedule(1, -1)


class _Task:
    """Just the stage a SplitTask exposes to its schedule."""

    def __init__(self) -> None:
        self.stage = "warm_start"  # SplitTask's default before any schedule runs

    def set_stage(self, stage: str) -> None:
        self.stage = stage


def test_the_log_names_the_starting_stage_then_each_change(caplog) -> None:
    sched, task, trainer = SplitSchedule(1, 1, dense_epochs=1), _Task(), SimpleNamespace(current_epoch=0)
    with caplog.at_level("INFO"):
        sched.on_train_start(trainer, task)
        sched.on_train_epoch_start(trainer, task)
        trainer.current_epoch = 1
        sched.on_train_epoch_start(trainer, task)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("splitlab:")]
    assert lines == [
        "splitlab: epoch 0: starting in stage dense",
        "splitlab: epoch 1: stage dense -> warm_start",
    ]
    assert task.stage == "warm_start"
