"""How long a fit's learning-rate schedules run: the batches of its supervised stages and of PPO."""

from __future__ import annotations

import math
from typing import Any


def stage_steps(trainer: Any, plan: dict[str, int] | None, which: str) -> int:
    """Batches the supervised stages (dense + warm start, ``which="supervised"``) or PPO will see in
    this fit of ``trainer``.

    The epoch counts come from the stage plan (the schedule callback gives it: `plan_stages`);
    without one, every batch of the fit counts for both.
    """
    if plan is None or not trainer.max_epochs or trainer.max_epochs < 1:
        return int(trainer.estimated_stepping_batches)
    per_epoch = math.ceil(trainer.estimated_stepping_batches / trainer.max_epochs)
    supervised = plan["dense"] + plan["warm_start"]
    return per_epoch * (supervised if which == "supervised" else trainer.max_epochs - supervised)
