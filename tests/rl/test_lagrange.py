"""The fraction controller (PID Lagrange multiplier) against hand-computed values."""

from __future__ import annotations

import pytest

from splitlab.rl import FractionController


def test_lambda_rises_above_target_and_falls_to_zero_below() -> None:
    ctrl = FractionController(target=0.5, lr=0.1, gain=0.5, damping=0.5)
    values = [ctrl.update(0.8) for _ in range(10)]
    assert all(b > a for a, b in zip(values, values[1:], strict=False)) and values[-1] > 0
    falling = [ctrl.update(0.2) for _ in range(40)]
    assert falling[-1] == 0.0 and min(falling) >= 0.0
    assert all(b <= a for a, b in zip(falling, falling[1:], strict=False))
    assert float(ctrl.integral) == 0.0  # never winds below zero


def test_plain_dual_update() -> None:
    ctrl = FractionController(target=0.5, lr=0.2, gain=0.0, damping=0.0, smoothing=0.0)
    assert ctrl.update(0.9) == pytest.approx(0.08)  # 0 + 0.2 * 0.4
    assert ctrl.update(0.4) == pytest.approx(0.06)
    assert ctrl.update(0.0) == pytest.approx(0.0)


def test_controller_state_round_trips() -> None:
    a = FractionController(target=0.3)
    for f in (0.9, 0.8, 0.5):
        a.update(f)
    b = FractionController(target=0.3)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value
    assert b.update(0.6) == a.update(0.6)


def test_controller_uses_the_reduced_mean() -> None:
    ctrl = FractionController(target=0.5, lr=1.0, gain=0.0, smoothing=0.0, reduce=lambda t: t * 0 + 0.7)
    assert ctrl.update(0.1) == pytest.approx(0.2)
