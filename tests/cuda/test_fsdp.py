"""`BlockFSDPStrategy` end to end on one GPU (Lightning runs FSDP on GPUs only; `make gpu-check` runs
this after the benchmarks): the blocks sharded, everything SPLIT uses outside the forward whole."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import fit, schedule_args

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]


def test_fsdp_trains_warm_start_and_ppo_and_checkpoints(shapes_root, tmp_path) -> None:
    """Warm start (task clip across shards, imitation), recalibration before validation, token-map
    pictures on rank 0, PPO's K backward passes through the whole decision module, full checkpoints."""
    fsdp = [
        "--trainer.accelerator=gpu",
        "--trainer.devices=1",
        "--trainer.strategy=splitlab.distributed.BlockFSDPStrategy",
        "--trainer.precision=bf16-mixed",
        "--model.init_args.eval_baselines=[]",
    ]
    cli = fit(shapes_root, tmp_path, *schedule_args(1, 1), *fsdp)
    assert cli.model.stage == "ppo"
    first, second = (
        torch.load(c, map_location="cpu", weights_only=False)["state_dict"]
        for c in sorted((tmp_path / "checkpoints").glob("epoch=*.ckpt"))[:2]
    )
    blocks = [k for k in first if ".blocks." in k]
    decision = [k for k in first if k.startswith("tokenizer.decision.")]
    assert blocks and decision and first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in blocks)  # PPO: the backbone is frozen
    assert any(not torch.equal(first[k], second[k]) for k in decision)  # and the policy learns
    assert all(torch.isfinite(v).all() for v in second.values() if v.is_floating_point())
