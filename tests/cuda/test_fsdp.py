"""`BlockFSDPStrategy` end to end on one GPU (Lightning runs FSDP on GPUs only; `make gpu-check` runs
this beside the other CUDA tests, before the benchmarks): the blocks sharded, everything SPLIT uses
outside the forward whole.

One GPU is FSDP's NO_SHARD in effect, so what this shows is the wiring (wrapping, the backward
finished inside ``training_step``, mixed precision, checkpoints that reload); the reduce-scatter
across ranks needs two GPUs."""

from __future__ import annotations

import pytest
import torch
from lightning import Callback

from splitlab.cli import lightning_main
from tests.helpers import fit, schedule_args, tiny_args

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]
FSDP = [
    "--trainer.accelerator=gpu",
    "--trainer.devices=1",
    # class_path: a bare `--trainer.strategy=splitlab...` is read by Lightning as a strategy name
    "--trainer.strategy.class_path=splitlab.distributed.BlockFSDPStrategy",
    "--trainer.precision=bf16-mixed",
    "--model.init_args.evaluation.eval_baselines=[]",
]


class FirstBlockAtStart(Callback):
    """A copy of the first block's qkv weight when training starts (after FSDP wrapped the model)."""

    weight: torch.Tensor | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        FirstBlockAtStart.weight = (
            pl_module.backbone.model.blocks[0].attn.qkv.weight.detach().float().cpu().clone()
        )


def test_fsdp_trains_warm_start_and_ppo_and_checkpoints(shapes_root, tmp_path) -> None:
    """Warm start (task clip across shards, imitation), recalibration before validation, token-map
    pictures on rank 0, PPO's K backward passes through the whole decision module, full checkpoints
    that validate again."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    probe = [{"class_path": "tests.cuda.test_fsdp.FirstBlockAtStart"}]
    cli = fit(shapes_root, tmp_path, *schedule_args(1, 1, also=probe), *FSDP)
    assert cli.model.stage == "ppo"
    wrapped = [m for m in cli.trainer.model.modules() if isinstance(m, FullyShardedDataParallel)]
    assert len(wrapped) == 1 + len(cli.model.backbone.model.blocks)  # the root and one per block
    points = cli.model.tokenizer.operating_points.budgets
    assert points.dtype == torch.float32  # not rounded to bf16 by FSDP's buffer casting

    first, second = (
        torch.load(c, map_location="cpu", weights_only=False)["state_dict"]
        for c in sorted((tmp_path / "checkpoints").glob("epoch=*.ckpt"))[:2]
    )
    blocks = [k for k in first if ".blocks." in k]
    decision = [k for k in first if k.startswith("model.tokenizer.decision.")]
    assert blocks and decision and first.keys() == second.keys()
    qkv = next(k for k in blocks if k.endswith("blocks.0.attn.qkv.weight"))
    assert not torch.equal(first[qkv].float(), FirstBlockAtStart.weight)  # the warm start reached the blocks
    assert all(torch.equal(first[k], second[k]) for k in blocks)  # PPO: the backbone is frozen
    assert any(not torch.equal(first[k], second[k]) for k in decision)  # and the policy learns
    assert all(torch.isfinite(v).all() for v in second.values() if v.is_floating_point())

    last = tmp_path / "checkpoints" / "last.ckpt"
    again = lightning_main(
        ["validate", *tiny_args(shapes_root, tmp_path / "again", *FSDP), f"--ckpt_path={last}"]
    )
    assert torch.equal(again.model.tokenizer.operating_points.budgets.cpu(), points.cpu())
