"""A callback for the DDP test: each rank writes its final stage, λ and policy weights."""

from __future__ import annotations

import os

import torch
from lightning import Callback


class RankProbe(Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        state = {
            "stage": pl_module.stage,
            "lambda": pl_module.controller.value,
            "decision": {k: v.detach().cpu() for k, v in pl_module.tokenizer.decision.state_dict().items()},
            "backbone_head": pl_module.backbone.model.head.weight.detach().cpu(),
            "world_size": trainer.world_size,
            "steps": int(pl_module.controller.steps),
        }
        os.makedirs(self.out, exist_ok=True)
        torch.save(state, os.path.join(self.out, f"rank{trainer.global_rank}.pt"))
