"""A callback for the DDP test: each rank writes its final stage, λ and policy weights."""

from __future__ import annotations

import os

import torch
from lightning import Callback


class RankProbe(Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_train_end(self, trainer, pl_module) -> None:
        state = {
            "stage": pl_module.stage,
            "lambda": pl_module.controller.value,
            "decision": {k: v.detach().cpu() for k, v in pl_module.tokenizer.decision.state_dict().items()},
            "backbone_head": pl_module.backbone.model.head.weight.detach().cpu(),
            "world_size": trainer.world_size,
            "steps": int(pl_module.controller.steps),
            "batches_run_here": self.batches,
        }
        os.makedirs(self.out, exist_ok=True)
        torch.save(state, os.path.join(self.out, f"rank{trainer.global_rank}.pt"))


class SignalAt(Callback):
    """Sends SLURM's requeue signal (SIGUSR1) to this process at one batch of one epoch, on rank 0 only."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch and trainer.global_rank == 0:
            import signal

            os.kill(os.getpid(), signal.SIGUSR1)
