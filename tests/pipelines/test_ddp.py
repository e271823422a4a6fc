"""Two CPU processes (DDP over gloo) through warm start and PPO of a budget-conditioned policy end with
identical λ and operating point per budget, and an identical policy."""

from __future__ import annotations

import torch

from tests.helpers import launch, slurm_job, two_rank_args


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


def test_a_lost_checkpoint_under_ddp_stops_every_rank(shapes_root, tmp_path) -> None:
    """Rank 0 alone writes checkpoints; when the write is lost it stops with the clear message, and the
    other rank must stop too with the same message, not wait at the checkpoint's barrier until the
    process group times out (30 minutes under NCCL) or die of a transport error. The ranks are started
    apart, as ``srun`` does, so each one's exit is seen."""
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 1, "rl_epochs": 0},
        },
        {"class_path": "tests.helpers.LostCheckpointWrites"},
    ]
    slurm = slurm_job("4243")
    args = two_rank_args(
        shapes_root, tmp_path / "logs", callbacks, 1, f"--trainer.default_root_dir={tmp_path}"
    )
    outputs = launch(["fit", *args], slurm, slurm_ranks=2, fails=True, timeout=240)
    for rank, out in enumerate(outputs):  # each rank ends with the same one line, no traceback
        last = out.strip().splitlines()[-1]
        said = last.startswith("splitlab: error: ") and "could not be written (nothing was written)" in last
        assert said and "Traceback" not in out, (rank, out[-2000:])
