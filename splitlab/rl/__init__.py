"""Policy learning for SPLIT: warm-start labels, PPO, and the token-fraction multiplier (plain PyTorch)."""

from splitlab.rl.labels import embedding_difference_scores, warm_start_labels
from splitlab.rl.lagrange import FractionController
from splitlab.rl.ppo import PPOConfig, advantages, bernoulli_entropy, bernoulli_log_prob, ppo_policy_loss

__all__ = [
    "FractionController",
    "PPOConfig",
    "advantages",
    "bernoulli_entropy",
    "bernoulli_log_prob",
    "embedding_difference_scores",
    "ppo_policy_loss",
    "warm_start_labels",
]
