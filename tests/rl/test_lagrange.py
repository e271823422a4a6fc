"""The fraction controller (PID Lagrange multiplier) against hand-computed values."""

from __future__ import annotations

import pytest

from splitlab.rl import FractionController


def test_lambda_rises_above_target_and_falls_to_zero_below() -> None:
    ctrl = FractionController(budget=0.5, lr=0.1, gain=0.5, damping=0.5)
    values = [ctrl.update(0.8) for _ in range(10)]
    assert all(b > a for a, b in zip(values, values[1:], strict=False)) and values[-1] > 0
    falling = [ctrl.update(0.2) for _ in range(40)]
    assert falling[-1] == 0.0 and min(falling) >= 0.0
    assert all(b <= a for a, b in zip(falling, falling[1:], strict=False))
    assert float(ctrl.integral) == 0.0  # never winds below zero


def test_plain_dual_update() -> None:
    ctrl = FractionController(budget=0.5, lr=0.2, gain=0.0, damping=0.0, smoothing=0.0)
    assert ctrl.update(0.9) == pytest.approx(0.08)  # 0 + 0.2 * 0.4
    assert ctrl.update(0.4) == pytest.approx(0.06)
    assert ctrl.update(0.0) == pytest.approx(0.0)


def test_controller_state_round_trips() -> None:
    a = FractionController(budget=0.3)
    for f in (0.9, 0.8, 0.5):
        a.update(f)
    b = FractionController(budget=0.3)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value
    assert b.update(0.6) == a.update(0.6)


def test_controller_uses_the_reduced_mean() -> None:
    ctrl = FractionController(budget=0.5, lr=1.0, gain=0.0, smoothing=0.0, reduce=lambda t: t * 0 + 0.7)
    assert ctrl.update(0.1) == pytest.approx(0.2)


def test_each_budget_point_keeps_its_own_multiplier_worked_by_hand() -> None:
    """Three points; lr 0.1, gain 0.5, damping 0.2, smoothing 0.5: each step moves its own point only,
    and λ between points is interpolated linearly."""
    ctrl = FractionController([0.3, 0.5, 0.7], lr=0.1, gain=0.5, damping=0.2, smoothing=0.5)
    # point 1 first step: e = 0.6 - 0.5 = 0.1 (unsmoothed), I = 0.1 * 0.1 = 0.01, λ = 0.01 + 0.5 * 0.1
    assert ctrl.update(0.6, point=1) == pytest.approx(0.06)
    assert ctrl.values.tolist() == pytest.approx([0.0, 0.06, 0.0])
    # point 0 first step: e = 0.4 - 0.3 = 0.1, the same arithmetic; point 1 untouched
    assert ctrl.update(0.4, point=0) == pytest.approx(0.06)
    # point 1 second step: e = 0.05, smoothed 0.5 * 0.1 + 0.5 * 0.05 = 0.075, change 0.075 - 0.1 = -0.025,
    # I = 0.01 + 0.1 * 0.05 = 0.015, λ = 0.015 + 0.5 * 0.075 + 0.2 * (-0.025) = 0.0475
    assert ctrl.update(0.55, point=1) == pytest.approx(0.0475)
    # point 2 first step: e = 0.2, I = 0.02, λ = 0.02 + 0.5 * 0.2 = 0.12
    assert ctrl.update(0.9, point=2) == pytest.approx(0.12)
    assert ctrl.values.tolist() == pytest.approx([0.06, 0.0475, 0.12])
    assert ctrl.steps.tolist() == [1, 2, 1] and ctrl.total_steps == 4
    assert ctrl.value_at(0.3) == pytest.approx(0.06)
    assert ctrl.value_at(0.4) == pytest.approx((0.06 + 0.0475) / 2)
    assert ctrl.value_at(0.65) == pytest.approx(0.0475 + 0.75 * (0.12 - 0.0475))
    assert ctrl.value_at(0.1) == pytest.approx(0.06) and ctrl.value_at(0.95) == pytest.approx(0.12)  # clamped
    # a step below target: e = -0.2, smoothed 0.5 * 0.1 + 0.5 * (-0.2) = -0.05, change -0.15,
    # I = 0.01 - 0.02 -> clamped to 0, λ = 0 - 0.025 - 0.03 < 0 -> 0
    assert ctrl.update(0.1, point=0) == 0.0 and float(ctrl.integral[0]) == 0.0
