"""PPO math against hand-computed values (on SPLIT's Bernoulli policy)."""

from __future__ import annotations

import math

import pytest
import torch

from splitlab.rl import advantages, ppo_policy_loss
from splitlab.tokenizer import policy


def h(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def scored(new: torch.Tensor, old: torch.Tensor, decisions: torch.Tensor) -> tuple[list, list, list]:
    """New and old log-probabilities and the new entropy of Bernoulli decisions (SPLIT's policy)."""
    return [policy.log_prob(new, decisions)], [policy.log_prob(old, decisions)], [policy.entropy(new)]


def hand_example(entropy_coef: float):
    # two rollouts, one level with two candidate decisions each; old policy p = 0.5 everywhere,
    # new policy p = 0.75 for the first decision, 0.5 for the second
    new = torch.tensor([[[math.log(3.0), 0.0]], [[math.log(3.0), 0.0]]], requires_grad=True)
    old = torch.zeros(2, 1, 2)
    decisions = torch.tensor([[[True, False]], [[False, True]]])
    candidates = torch.ones(2, 1, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    loss, stats = ppo_policy_loss(*scored(new, old, decisions), [candidates], adv, 0.2, entropy_coef)
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
        *scored(new, torch.zeros(1, 1, 2), decisions), [candidates], torch.tensor([1.0]), entropy_coef=0.0
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
        *scored(new, new.detach(), torch.rand(12, 2, 2) < 0.5),
        [torch.ones(12, 2, 2, dtype=torch.bool)],
        adv.reshape(-1),
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()


def test_decision_normalisation_weighs_every_decision_the_same() -> None:
    """The default: every decision weighs the same (the unbiased per-decision average)."""
    # rollout 0 has one candidate, rollout 1 three; all ratios 1, advantages +1 and -1
    logits = torch.zeros(2, 1, 3, requires_grad=True)
    taken = torch.ones(2, 1, 3, dtype=torch.bool)
    cand = torch.tensor([[[True, False, False]], [[True, True, True]]])
    adv = torch.tensor([1.0, -1.0])
    per_rollout, _ = ppo_policy_loss(
        *scored(logits, logits.detach(), taken), [cand], adv, entropy_coef=0.0, normalize="rollout"
    )
    per_decision, _ = ppo_policy_loss(*scored(logits, logits.detach(), taken), [cand], adv, entropy_coef=0.0)
    assert per_rollout.item() == pytest.approx(-(1.0 - 1.0) / 2)  # images weigh the same: 0
    assert per_decision.item() == pytest.approx(-(1.0 - 3.0) / 4)  # decisions weigh the same: +0.5


def test_ppo_improves_the_reward_of_a_toy_policy() -> None:
    """One level of 16 candidates; the reward counts splits on the first 4 (useful) minus 0.5 per
    split (the token price): the best policy splits exactly those 4. From p = 0.5 everywhere, PPO
    with rollout baselines and clipping must raise the mean reward."""
    torch.manual_seed(0)
    logits = torch.zeros(1, 1, 16, requires_grad=True)
    useful = torch.zeros(1, 1, 16, dtype=torch.bool)
    useful[..., :4] = True
    opt = torch.optim.Adam([logits], lr=0.1)
    cand = [torch.ones(8, 1, 16, dtype=torch.bool)]

    def reward(taken: torch.Tensor) -> torch.Tensor:
        return (taken & useful).flatten(1).sum(1).float() - 0.5 * taken.flatten(1).sum(1).float()

    def mean_reward() -> float:
        with torch.no_grad():
            taken = policy.sample([logits.expand(4096, 1, 16)])[0]
        return reward(taken).mean().item()

    start = mean_reward()
    for _ in range(40):
        with torch.no_grad():
            old = logits.expand(8, 1, 16).clone()
            taken = policy.sample([old])[0]
            adv = advantages(reward(taken).view(8, 1)).reshape(-1)
        for _ in range(4):
            new = logits.expand(8, 1, 16)
            loss, _ = ppo_policy_loss(*scored(new, old, taken), cand, adv, entropy_coef=0.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert start == pytest.approx(-2.0, abs=0.15)  # p = 0.5: 2 useful of 8 splits, minus 8 x 0.5
    assert mean_reward() > 1.5  # near the optimum of 4 - 2 = 2
