"""Fault tolerance under SLURM: 2 DDP ranks (gloo) in a fake SLURM job get SIGUSR1 inside PPO,
checkpoint and requeue; the requeued job resumes and ends exactly where an uninterrupted job ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import tiny_args

TESTS = Path(__file__).parent


def slurm_fit(shapes_root, workdir: Path, probe: Path, extra_callbacks: list[dict], fake_bin: Path) -> None:
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 1, "rl_epochs": 2},
        },
        {"class_path": "splitlab.callbacks.SlurmRequeue"},
        {"class_path": "ddp_probe.RankProbe", "init_args": {"out": str(probe)}},
        *extra_callbacks,
    ]
    args = tiny_args(shapes_root, workdir / "logs", "--data.init_args.batch_size=4")
    args += [
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.num_nodes=1",
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=3",
        f"--trainer.default_root_dir={workdir}",
        f"--trainer.callbacks={json.dumps(callbacks)}",
        "--model.init_args.eval_baselines=[]",
    ]
    base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(fake_bin), os.environ["PATH"]]),
        "OMP_NUM_THREADS": "1",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "splitlab-test",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "splitlab", "fit", *args],
            env={**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]


def test_sigusr1_checkpoints_requeues_and_resumes_exactly(shapes_root, tmp_path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "scontrol.log"
    (fake_bin / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    (fake_bin / "scontrol").chmod(0o755)

    slurm_fit(shapes_root, tmp_path / "reference", tmp_path / "probe_reference", [], fake_bin)
    assert not calls.exists()

    job = tmp_path / "job"
    signal_in_ppo = [{"class_path": "ddp_probe.SignalAt", "init_args": {"epoch": 1, "batch": 1}}]
    slurm_fit(shapes_root, job, tmp_path / "probe_interrupted", signal_in_ppo, fake_bin)
    assert calls.read_text().split() == ["requeue", "4242"]
    assert (job / "hpc_ckpt_1.ckpt").exists()
    saved = torch.load(job / "hpc_ckpt_1.ckpt", weights_only=False)
    assert saved["splitlab"]["stage"] == "ppo" and saved["epoch"] == 1

    slurm_fit(shapes_root, job, tmp_path / "probe_resumed", [], fake_bin)  # the requeued job, same command
    for rank in (0, 1):
        ref = torch.load(tmp_path / "probe_reference" / f"rank{rank}.pt", weights_only=False)
        got = torch.load(tmp_path / "probe_resumed" / f"rank{rank}.pt", weights_only=False)
        first = torch.load(tmp_path / "probe_interrupted" / f"rank{rank}.pt", weights_only=False)
        # the requeued job continued from the checkpoint: together the two jobs ran each batch once
        assert 0 < got["batches_run_here"] < ref["batches_run_here"]
        assert first["batches_run_here"] + got["batches_run_here"] == ref["batches_run_here"]
        assert got["stage"] == ref["stage"] == "ppo" and got["steps"] == ref["steps"]
        assert got["lambda"] == ref["lambda"]
        for key, value in ref["decision"].items():
            assert torch.equal(value, got["decision"][key]), key
        assert torch.equal(ref["backbone_head"], got["backbone_head"])
