"""PPO math, warm-start labels and the fraction controller, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from splitlab.rl import (
    FractionController,
    advantages,
    embedding_difference_scores,
    ppo_policy_loss,
    warm_start_labels,
)
from splitlab.tokenizer import Levels, fraction_of


def h(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def hand_example(entropy_coef: float):
    # two rollouts, one level with two candidate decisions each; old policy p = 0.5 everywhere,
    # new policy p = 0.75 for the first decision, 0.5 for the second
    new = torch.tensor([[[math.log(3.0), 0.0]], [[math.log(3.0), 0.0]]], requires_grad=True)
    old = torch.zeros(2, 1, 2)
    decisions = torch.tensor([[[True, False]], [[False, True]]])
    candidates = torch.ones(2, 1, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    loss, stats = ppo_policy_loss(
        [new], [old], [decisions], [candidates], adv, clip=0.2, entropy_coef=entropy_coef
    )
    return new, loss, stats


def test_clipped_surrogate_by_hand() -> None:
    new, loss, stats = hand_example(entropy_coef=0.0)
    # rollout 0 (A=+1): ratio 1.5 clipped to 1.2, ratio 1 -> mean 1.1
    # rollout 1 (A=-1): ratio 0.25/0.5 = 0.5 -> min(-0.5, -0.8) = -0.8 (clipped below), ratio 1 -> -1; mean -0.9
    assert stats["surrogate"].item() == pytest.approx((1.1 - 0.9) / 2)
    assert loss.item() == pytest.approx(-0.1)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    loss.backward()
    # both clipped decisions (one above 1 + eps with A > 0, one below 1 - eps with A < 0) get no gradient
    assert new.grad[0, 0, 0].item() == 0.0 and new.grad[1, 0, 0].item() == 0.0
    # unclipped: |d ratio / d logit| = sigma'(0) / 0.5 = 0.5, / 2 decisions, / 2 rollouts, negated for the loss.
    # rollout 0 kept (ratio falls with the logit) with A = +1, rollout 1 split (rises) with A = -1: both +0.125
    assert new.grad[0, 0, 1].item() == pytest.approx(0.125)
    assert new.grad[1, 0, 1].item() == pytest.approx(0.125)


def test_entropy_term_by_hand() -> None:
    _, loss, stats = hand_example(entropy_coef=0.1)
    mean_entropy = (h(0.75) + h(0.5)) / 2
    assert stats["entropy"].item() == pytest.approx(mean_entropy, rel=1e-5)
    assert loss.item() == pytest.approx(-0.1 - 0.1 * mean_entropy, rel=1e-5)


def test_only_candidates_count() -> None:
    new = torch.tensor([[[5.0, 0.0]]], requires_grad=True)
    decisions = torch.tensor([[[True, True]]])
    candidates = torch.tensor([[[False, True]]])
    loss, stats = ppo_policy_loss(
        [new], [torch.zeros(1, 1, 2)], [decisions], [candidates], torch.tensor([1.0]), entropy_coef=0.0
    )
    assert stats["surrogate"].item() == pytest.approx(1.0)  # the non-candidate's ratio of 2 is ignored
    loss.backward()
    assert new.grad[0, 0, 0].item() == 0.0


def test_advantages_subtract_each_images_mean_and_normalise() -> None:
    rewards = torch.tensor([[1.0, 3.0], [3.0, 7.0]])  # 2 rollouts x 2 images
    adv = advantages(rewards)
    centred = torch.tensor([[-1.0, -2.0], [1.0, 2.0]])
    assert torch.allclose(adv, centred / centred.pow(2).mean().sqrt())
    assert adv.pow(2).mean().item() == pytest.approx(1.0)
    single = advantages(torch.tensor([[1.0, 2.0, 3.0]]))  # one rollout: the batch mean is the baseline
    assert torch.allclose(single, torch.tensor([[-1.0, 0.0, 1.0]]) / math.sqrt(2 / 3))


def test_all_equal_rewards_give_a_finite_loss() -> None:
    adv = advantages(torch.full((4, 3), -0.7))
    assert torch.equal(adv, torch.zeros(4, 3))
    new = torch.randn(12, 2, 2, requires_grad=True)
    loss, _ = ppo_policy_loss(
        [new],
        [new.detach()],
        [torch.rand(12, 2, 2) < 0.5],
        [torch.ones(12, 2, 2, dtype=torch.bool)],
        adv.reshape(-1),
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()


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


def test_embedding_difference_scores_and_labels() -> None:
    d = 8
    fine = torch.zeros(2, 4, 4, d)
    fine[0, :2, :2] = torch.randn(2, 2, d)  # detail in the top-left level-1 patch of image 0
    mid = torch.ones(2, 2, 2, d)
    coarse = torch.ones(2, 1, 1, d)
    scores = embedding_difference_scores([coarse, mid, fine])
    assert scores[1][0, 0, 0] > scores[1][0, 1, 1] and scores[1][0, 0, 0] > scores[1][1, 0, 0]
    content = [torch.randn(16, 1, 1, d), torch.randn(16, 2, 2, d), torch.randn(16, 4, 4, d)]
    for target in (0.25, 0.5, 0.75):
        labels, _ = warm_start_labels(content, Levels((4, 2, 1)), target=target)
        assert fraction_of(labels).mean().item() == pytest.approx(target, abs=0.03)
