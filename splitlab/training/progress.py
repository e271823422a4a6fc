"""Where SPLIT's training stands: the stage (dense -> warm start -> PPO) and the PPO updates run.

One object, one writer of each: the schedule enters stages (`Progress.enter`), PPO counts its updates
(`count_ppo_step`), a checkpoint restores both (`restore`). What each stage trains follows from it
(`policy_trains`, `task_frozen`), for the Lightning task and a plain loop alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from splitlab.model.record import STAGES

Stage = Literal["dense", "warm_start", "ppo"]


@dataclass
class Progress:
    """The stage training is in and the PPO updates run so far (a policy with none only imitated).

    Attributes:
        stage: ``dense`` (the uniform grid), ``warm_start`` (imitation while the task fine-tunes, the
            default before any schedule runs) or ``ppo`` (the task frozen, the policy learns).
        ppo_steps: PPO updates run (checkpointed; `splitlab.model.SplitModel.holds` reports it).
    """

    stage: Stage = "warm_start"
    ppo_steps: int = 0

    def enter(self, stage: Stage) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage={stage!r}: expected one of {STAGES}")
        self.stage = stage

    def count_ppo_step(self) -> None:
        self.ppo_steps += 1

    def record(self) -> dict[str, Any]:
        """What a checkpoint and a saved model keep: ``stage`` and ``ppo_steps``."""
        return {"stage": self.stage, "ppo_steps": self.ppo_steps}

    def restore(self, saved: Mapping[str, Any]) -> bool:
        """Take a checkpoint's record (`record`); whether it held a stage. A checkpoint from before the
        count in the PPO stage is taken to have run PPO."""
        if "stage" in saved:
            self.enter(saved["stage"])
        self.ppo_steps = int(saved.get("ppo_steps", 1 if saved.get("stage") == "ppo" else 0))
        return "stage" in saved

    def policy_trains(self, policy: str, transfer_finetune: bool = False) -> bool:
        """Whether this stage updates the decision module: a learned policy's warm start (imitation)
        and PPO, a transferred one's PPO with ``transfer_finetune``; never a fixed policy's."""
        if policy == "learned":
            return self.stage != "dense"
        return policy == "transferred" and transfer_finetune and self.stage == "ppo"

    def task_frozen(self, finetune: bool = True) -> bool:
        """Whether this stage leaves backbone, head and embeddings as they are: PPO, and the warm start
        of a run that does not fine-tune in it (``warm_start.finetune: false``)."""
        return self.stage == "ppo" or (self.stage == "warm_start" and not finetune)
