"""`BudgetSampler`: which budget point a batch of a budget-conditioned policy trains at (worked by hand)."""

from __future__ import annotations

import pytest
import torch

from splitlab.rl import BudgetSampler


def seen_once(losses: list[float], floor: float = 0.1) -> BudgetSampler:
    sampler = BudgetSampler(len(losses), floor=floor)
    for point, loss in enumerate(losses):
        sampler.update(point, torch.tensor([loss, loss]))  # a batch's losses: their mean is folded in
    return sampler


def test_uniform_until_every_point_has_been_seen() -> None:
    sampler = BudgetSampler(4)
    sampler.update(0, 5.0)
    assert torch.allclose(sampler.probabilities(), torch.full((4,), 0.25))


def test_probability_follows_the_loss_above_the_cheapest_point() -> None:
    # excess over the lowest loss 0.2: [0.3, 0.1, 0, 0, 0] -> shares [0.75, 0.25, 0, 0, 0];
    # with a 10% uniform floor: 0.1 * 0.2 + 0.9 * share
    p = seen_once([0.5, 0.3, 0.2, 0.2, 0.2]).probabilities()
    assert torch.allclose(p, torch.tensor([0.695, 0.245, 0.02, 0.02, 0.02]))
    assert torch.isclose(p.sum(), torch.tensor(1.0))


def test_equal_losses_draw_uniformly() -> None:
    assert torch.allclose(seen_once([0.4, 0.4, 0.4]).probabilities(), torch.full((3,), 1 / 3))


def test_moving_average_and_reduce() -> None:
    sampler = seen_once([0.5, 0.2])
    sampler.update(0, 0.1)  # 0.5 + 0.1 * (0.1 - 0.5)
    assert sampler.loss[0].item() == pytest.approx(0.46)
    sampler.update(1, 0.1, reduce=lambda t: t * 3)  # the mean over ranks replaces the local value
    assert sampler.loss[1].item() == pytest.approx(0.2 + 0.1 * (0.3 - 0.2))
    assert sampler.seen.tolist() == [2, 2]


def test_draws_repeat_for_a_seed_and_follow_the_probabilities() -> None:
    sampler = seen_once([0.9, 0.1, 0.1], floor=0.0)  # only point 0 costs anything
    assert {sampler.draw(seed) for seed in range(20)} == {0}
    even = BudgetSampler(5)
    assert [even.draw(s) for s in range(30)] == [even.draw(s) for s in range(30)]
    assert len({even.draw(s) for s in range(30)}) > 1


def test_state_survives_a_checkpoint() -> None:
    sampler = seen_once([0.5, 0.3, 0.2])
    restored = BudgetSampler(3)
    restored.load_state_dict(sampler.state_dict())
    assert torch.equal(restored.probabilities(), sampler.probabilities())


def test_floor_outside_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="floor=1.5"):
        BudgetSampler(3, floor=1.5)
