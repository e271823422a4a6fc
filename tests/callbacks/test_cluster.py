"""Fault tolerance under SLURM: 2 DDP ranks (gloo) in a fake SLURM job get SIGUSR1 inside PPO,
checkpoint and requeue; the requeued job resumes and ends exactly where an uninterrupted job ends."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import launch, slurm_job, two_rank_args


def slurm_fit(shapes_root, workdir: Path, probe: Path, extra_callbacks: list[dict], fake_bin: Path) -> None:
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 1, "rl_epochs": 2},
        },
        {"class_path": "splitlab.callbacks.SlurmRequeue"},
        {"class_path": "tests.helpers.RankProbe", "init_args": {"out": str(probe)}},
        *extra_callbacks,
    ]
    args = two_rank_args(shapes_root, workdir / "logs", callbacks, 3, f"--trainer.default_root_dir={workdir}")
    slurm = slurm_job("4242", PATH=os.pathsep.join([str(fake_bin), os.environ["PATH"]]))
    launch(["fit", *args], slurm, slurm_ranks=2)


def logged_rows(metrics_csv: Path) -> list[dict[str, str]]:
    """The CSV logger's rows as {metric: value}, empty cells left out, so that a column added
    later (the logger rewrites the file with the new header) does not change a row."""
    with metrics_csv.open(newline="") as rows:
        return [{key: value for key, value in row.items() if value} for row in csv.DictReader(rows)]


@pytest.mark.distributed
def test_sigusr1_checkpoints_requeues_and_resumes_exactly(shapes_root, tmp_path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "scontrol.log"
    (fake_bin / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    (fake_bin / "scontrol").chmod(0o755)

    slurm_fit(shapes_root, tmp_path / "reference", tmp_path / "probe_reference", [], fake_bin)
    assert not calls.exists()

    job = tmp_path / "job"
    signal_in_ppo = [{"class_path": "tests.helpers.SignalAt", "init_args": {"epoch": 1, "batch": 1}}]
    slurm_fit(shapes_root, job, tmp_path / "probe_interrupted", signal_in_ppo, fake_bin)
    assert calls.read_text().split() == ["requeue", "4242"]
    assert (job / "hpc_ckpt_1.ckpt").exists()
    saved = torch.load(job / "hpc_ckpt_1.ckpt", weights_only=False)
    assert saved["splitlab"]["stage"] == "ppo" and saved["epoch"] == 1

    logged = logged_rows(job / "logs" / "metrics.csv")
    slurm_fit(shapes_root, job, tmp_path / "probe_resumed", [], fake_bin)  # the requeued job, same command
    # the requeued job wrote on in the same log folder and kept what the first slot logged (by name:
    # a metric first logged after the requeue, the stopped epoch's time, adds a column)
    assert logged_rows(job / "logs" / "metrics.csv")[: len(logged)] == logged
    for rank in (0, 1):
        ref = torch.load(tmp_path / "probe_reference" / f"rank{rank}.pt", weights_only=False)
        got = torch.load(tmp_path / "probe_resumed" / f"rank{rank}.pt", weights_only=False)
        first = torch.load(tmp_path / "probe_interrupted" / f"rank{rank}.pt", weights_only=False)
        # the requeued job continued from the checkpoint: together the two jobs ran each batch once
        assert 0 < got["batches_run_here"] < ref["batches_run_here"]
        assert first["batches_run_here"] + got["batches_run_here"] == ref["batches_run_here"]
        assert got["stage"] == ref["stage"] == "ppo" and got["steps"] == ref["steps"]
        assert got["lambda"] == ref["lambda"] and got["cuts"] == ref["cuts"]
        assert got["draw"] == ref["draw"]  # each rank's sampling stream came back from the checkpoint
        for key, value in ref["decision"].items():
            assert torch.equal(value, got["decision"][key]), key
        assert torch.equal(ref["backbone_head"], got["backbone_head"])


@pytest.mark.parametrize("scontrol", ["#!/bin/sh\nexit 1\n", None], ids=["requeue-refused", "no-scontrol"])
def test_a_job_that_could_not_be_requeued_warns_and_fails(tmp_path, monkeypatch, scontrol) -> None:
    """Without the requeue the job ends unfinished: a warning naming the checkpoint, and exit 128 +
    signal so that SLURM marks it failed (a missing scontrol, e.g. in a container, too)."""
    import signal
    from types import SimpleNamespace

    from splitlab.callbacks import SlurmRequeue

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    if scontrol:
        (fake_bin / "scontrol").write_text(scontrol)
        (fake_bin / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_bin))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    requeue = SlurmRequeue()
    requeue.checkpoint = str(tmp_path / "hpc_ckpt_1.ckpt")
    with pytest.warns(UserWarning, match=f"scontrol requeue 4242 failed .*--ckpt_path {requeue.checkpoint}"):
        requeue.after_checkpoint(SimpleNamespace(is_global_zero=True, loggers=[]), signal.SIGUSR1)
    assert requeue.exit_code == 128 + signal.SIGUSR1
