"""Two-stage training end to end on tiny generated data: CLI, stages, freezing, resume, summary."""

from __future__ import annotations

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
