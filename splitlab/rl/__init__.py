"""Policy learning for SPLIT: PPO and the token-fraction multiplier (plain PyTorch, nothing else).

The policy's distribution and the warm-start labels live with the tokenizer
(`splitlab.tokenizer.policy`, `splitlab.tokenizer.labels`); this room only optimises.
"""

from splitlab.rl.budget_sampler import BudgetSampler
from splitlab.rl.lagrange import FractionController
from splitlab.rl.ppo import PPOConfig, advantages, ppo_policy_loss

__all__ = ["BudgetSampler", "FractionController", "PPOConfig", "advantages", "ppo_policy_loss"]
