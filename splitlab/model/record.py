"""What a model holds, read from the record its training left (``trained``: ``stage``, ``ppo_steps``):
the one wording that ``splitlab.load``, ``predict``, ``export``, ``calibrate`` and ``bench`` print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from splitlab.tokenizer import OperatingPoints

STAGES = ("dense", "warm_start", "ppo")  # a training run's stages, in order


def policy_state(policy: str, trained: Mapping[str, Any]) -> str:
    """What the deployed policy is: ``learned`` (PPO trained it), ``imitation`` (a run stopped in its
    warm start, or before its first PPO step: the decision module only imitated its labels),
    ``uniform`` (a dense stage's model) or the trained baseline (``entropy``, ``random``); a model
    whose training splitlab did not record (`from_timm`) says its policy."""
    stage = trained.get("stage")
    if policy != "learned" or stage is None:
        return policy
    if stage == "dense":
        return "uniform"
    return "learned" if stage == "ppo" and int(trained.get("ppo_steps", 1)) > 0 else "imitation"


def holds(state: str, trained: Mapping[str, Any], points: OperatingPoints) -> str:
    """One line of what a model in ``state`` is, and the budgets its cuts (``points``) were set for."""
    if state == "uniform":
        return "a dense stage's model (uniform grid: no policy trained yet)"
    seen = [f"{b:g}" for b, n in zip(points.budgets.tolist(), points.counts.tolist(), strict=True) if n > 0]
    cuts = f"cuts calibrated for budget {', '.join(seen)}" if seen else "cuts never calibrated"
    if state == "imitation":
        where = "before its first PPO step" if trained.get("stage") == "ppo" else "in its warm start"
        return f"policy imitation (training stopped {where}: PPO never trained it), {cuts}"
    if state == "learned" and trained:
        return f"policy learned (PPO: {int(trained.get('ppo_steps', 0))} steps), {cuts}"
    return f"policy {state}, {cuts}" if state == "learned" else f"policy {state}"


def unfinished(state: str, held: str) -> str | None:
    """One line when training stopped before PPO trained the policy (what to run), else None."""
    if state != "imitation":
        return None
    return (
        f"this model holds a {held}; finish the run before deploying it: "
        "splitlab fit --config RUN/config.yaml --ckpt_path last"
    )


def older_apt_budget(module: Any, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """A file written before the name said what it holds keeps APT's budget as ``apt_fraction``."""
    if prefix + "apt_fraction" in state:
        state[prefix + "apt_budget"] = state.pop(prefix + "apt_fraction")
