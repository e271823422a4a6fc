"""Two CPU processes (DDP over gloo) through warm start and PPO end with identical λ and policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import tiny_args

TESTS = Path(__file__).parent


def test_two_rank_ddp_run_agrees(shapes_root, tmp_path) -> None:
    probe = tmp_path / "probe"
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 1, "rl_epochs": 1},
        },
        {"class_path": "ddp_probe.RankProbe", "init_args": {"out": str(probe)}},
    ]
    args = tiny_args(shapes_root, tmp_path / "logs", "--data.init_args.batch_size=4")
    args += [
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=2",
        f"--trainer.callbacks={json.dumps(callbacks)}",
        "--model.init_args.eval_baselines=[]",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "splitlab", "fit", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(probe / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert all(r["world_size"] == 2 and r["stage"] == "ppo" for r in ranks)
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert ranks[0]["lambda"] == ranks[1]["lambda"]
    for key, value in ranks[0]["decision"].items():
        assert torch.equal(value, ranks[1]["decision"][key]), key
    assert torch.equal(ranks[0]["backbone_head"], ranks[1]["backbone_head"])
