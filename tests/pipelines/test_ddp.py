"""Two CPU processes (DDP over gloo) through warm start and PPO of a budget-conditioned policy end with
identical λ and operating point per budget, and an identical policy."""

from __future__ import annotations

import torch

from tests.helpers import launch, two_rank_args


def test_two_rank_ddp_run_agrees(shapes_root, tmp_path) -> None:
    probe = tmp_path / "probe"
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 1, "rl_epochs": 1},
        },
        {"class_path": "tests.helpers.RankProbe", "init_args": {"out": str(probe)}},
    ]
    args = two_rank_args(shapes_root, tmp_path / "logs", callbacks, 2)
    launch(["fit", *args])
    ranks = [torch.load(probe / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert all(r["world_size"] == 2 and r["stage"] == "ppo" for r in ranks)
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert len(ranks[0]["lambda"]) == 5 and ranks[0]["lambda"] == ranks[1]["lambda"]  # one λ per budget point
    assert ranks[0]["cuts"] == ranks[1]["cuts"]  # the deployed operating points agree too
    for key, value in ranks[0]["decision"].items():
        assert torch.equal(value, ranks[1]["decision"][key]), key
    assert torch.equal(ranks[0]["backbone_head"], ranks[1]["backbone_head"])
    assert ranks[0]["draw"] != ranks[1]["draw"]  # but every rank samples its own rollouts
