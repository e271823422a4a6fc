"""The project's own sbatch scripts under a real SLURM scheduler (`scripts/slurm-local.sh`: munge,
slurmctld and slurmd on this host), as a user runs them on the classification twin with CPU
overrides on the command line.

A job interrupted by its time limit (``--signal=SIGUSR1@90``) and one interrupted on demand
(``scancel --signal=USR1``, as SLURM's warning arrives) are each checkpointed by `SlurmRequeue` at a
batch end, requeued, resumed at the exact batch, kept in the script's one run folder with a continuous
``metrics.csv``, and finish with the summary of the same run never interrupted. `make test-slurm`
runs them (`.ci/run` installs Debian's slurm-wlm and munge first); without SLURM they are skipped.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, schedule_args, tiny_args

pytestmark = pytest.mark.slurm
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel")
BIN = Path(sys.executable).parent


def installed(tool: str) -> bool:
    return shutil.which(tool) is not None or (Path("/usr/sbin") / tool).exists()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> dict[str, str]:
    """A running single-node cluster; the environment that talks to it."""
    missing = [t for t in TOOLS if not installed(t)]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
    folder = tmp_path_factory.mktemp("cluster")
    script = REPO / "scripts" / "slurm-local.sh"
    started = subprocess.run(
        ["bash", str(script), "start", str(folder)], capture_output=True, text=True, timeout=180
    )
    assert started.returncode == 0, started.stderr + "".join(p.read_text() for p in folder.glob("*.log"))
    env = {
        **os.environ,
        "SLURM_CONF": str(folder / "slurm.conf"),
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}:/usr/sbin",
        "PYTHONPATH": str(REPO),  # the jobs load tests.helpers.SlowBatches
        "OMP_NUM_THREADS": "1",
    }
    yield env
    subprocess.run(["bash", str(script), "stop", str(folder)], timeout=180)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    from splitlab.data import generate_shapes

    return generate_shapes(tmp_path_factory.mktemp("shapes"), train=100, val=20, test=2, seed=3)


def twin_args(shapes: Path, slow: float) -> list[str]:
    """What a user passes after the recipe: the CI twin (which sets trainer.callbacks as a whole list,
    replacing slurm.yaml's) with CPU overrides, a warm-start and a PPO epoch of 50 batches."""
    also = [{"class_path": "tests.helpers.SlowBatches", "init_args": {"seconds": slow}}] if slow else []
    args = tiny_args(shapes, "runs/overridden-by-the-script", *schedule_args(1, 1, also=also))
    return [*args[2:], "--trainer.accelerator=cpu", "--trainer.precision=32-true", "--trainer.strategy=auto"]


def submit(
    cluster: dict[str, str], folder: Path, time_limit: int, args: list[str], script: Path | None = None
) -> str:
    """``sbatch [sbatch options] SCRIPT tasks/imagenet.yaml ARGS`` with CPU overrides (``one_node.sbatch``
    by default; ``--nodes=...`` among ``args`` goes to sbatch); the job id."""
    folder.mkdir(parents=True, exist_ok=True)
    options = [a for a in args if a.startswith("--nodes=")]
    args = [a for a in args if not a.startswith("--nodes=")]
    done = subprocess.run(
        [
            "sbatch",
            "--parsable",
            *options,
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "--gpus-per-node=0",
            "--mem=4000",
            f"--time={time_limit}",
            f"--chdir={REPO}",
            f"--output={folder}/%x-%j.out",
            str(script or REPO / "configs" / "slurm" / "one_node.sbatch"),
            str(REPO / "tasks" / "imagenet.yaml"),
            *args,
        ],
        env={**cluster, "RUN_DIR": str(folder / "run")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def job(cluster: dict[str, str], job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Restarts, ...)."""
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=cluster, capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S+)", shown.stdout))


def wait(cluster: dict[str, str], job_id: str, until, what: str, limit: float = 900) -> dict[str, str]:
    """Poll the job until ``until(fields)``; fail naming ``what`` after ``limit`` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        fields = job(cluster, job_id)
        if until(fields):
            return fields
        if fields.get("JobState") in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        time.sleep(2)
    pytest.fail(f"job {job_id}: {what} did not happen (state {fields.get('JobState')}); {fields}")


def uninterrupted(shapes: Path, folder: Path, cluster: dict[str, str]) -> dict:
    """The same fit never interrupted (no SLURM, one thread as the job has), its summary."""
    args = [*tiny_args(shapes, folder, *schedule_args(1, 1)), "--trainer.accelerator=cpu"]
    env = {k: v for k, v in cluster.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [str(BIN / "lightning"), "fit", *args], env=env, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "summary.json").read_text())


def check_the_job(folder: Path, job_id: str, reference: dict) -> str:
    """Everything a requeued job must show; its output."""
    log = "".join(p.read_text() for p in folder.glob(f"*-{job_id}.out"))
    assert "splitlab: SLURM requeue signal: saved" in log and f"scontrol requeue {job_id}: requeued" in log
    assert "Handling auto-requeue signal" not in log  # Lightning's own handler never saved
    assert re.search(r"resuming epoch \d+ after batch \d+", log), log[-3000:]
    assert "Previous log files in this directory will be deleted" not in log
    run = folder / "run"
    # the script's run folder holds every file of the job, whatever config followed
    logs = run / f"version_{job_id}"
    assert (logs / "summary.json").is_file() and (logs / "checkpoints" / "last.ckpt").is_file()
    assert list(run.glob("hpc_ckpt_*.ckpt")) and not (REPO / "runs" / "overridden-by-the-script").exists()
    rows = [r for r in csv.DictReader((logs / "metrics.csv").open()) if r.get("train/loss")]
    steps = [int(float(r["step"])) for r in rows]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps  # continuous, nothing twice
    summary = json.loads((logs / "summary.json").read_text())
    for policy, row in reference["policies"].items():
        for key in ("metric", "token_fraction_mean"):
            assert summary["policies"][policy][key] == pytest.approx(row[key], abs=1e-6), (policy, key)
    assert summary["lambda"] == pytest.approx(reference["lambda"], abs=1e-6)
    return log


@pytest.fixture(scope="module")
def reference(shapes, tmp_path_factory, cluster) -> dict:
    return uninterrupted(shapes, tmp_path_factory.mktemp("reference"), cluster)


def test_the_time_limit_requeues_and_the_job_finishes_as_if_never_stopped(
    cluster, shapes, reference, tmp_path
) -> None:
    """A 3-minute slot: SLURM's warning 90 s before its end falls in the middle of training."""
    job_id = submit(cluster, tmp_path, 3, twin_args(shapes, slow=1.0))
    fields = wait(cluster, job_id, lambda f: f.get("JobState") == "COMPLETED", "completion", limit=1200)
    assert int(fields["Restarts"]) >= 1
    check_the_job(tmp_path, job_id, reference)


def test_a_warning_in_ppo_requeues_at_a_batch_end(cluster, shapes, reference, tmp_path) -> None:
    """The warning sent by hand once PPO runs (``scancel --signal=USR1``: what SLURM sends)."""
    job_id = submit(cluster, tmp_path, 30, twin_args(shapes, slow=0.5))
    out = tmp_path / f"splitlab-{job_id}.out"
    start = time.monotonic()
    while "-> ppo" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() - start < 600, "PPO never started"
        time.sleep(1)
    time.sleep(5)  # a few PPO batches in
    subprocess.run(["scancel", "--signal=USR1", job_id], env=cluster, check=True)
    fields = wait(cluster, job_id, lambda f: f.get("JobState") == "COMPLETED", "completion")
    assert int(fields["Restarts"]) == 1
    log = check_the_job(tmp_path, job_id, reference)
    assert re.search(r"resuming epoch 1 after batch [1-9]", log), "the requeue did not land in PPO's epoch"


def test_the_multi_node_script_runs_on_the_nodes_there_are(cluster, shapes, tmp_path) -> None:
    """multi_node.sbatch on this one-host cluster (``--nodes=1`` on the command line; two slurmd on one
    host need Slurm's multiple-slurmd mode and node addresses of their own, not set up here): the
    trainer takes the allocation's node and task counts, and the job's files land in its run folder."""
    script = REPO / "configs" / "slurm" / "multi_node.sbatch"
    job_id = submit(cluster, tmp_path, 10, ["--nodes=1", *twin_args(shapes, slow=0)], script=script)
    wait(cluster, job_id, lambda f: f.get("JobState") == "COMPLETED", "completion", limit=600)
    summary = json.loads((tmp_path / "run" / f"version_{job_id}" / "summary.json").read_text())
    assert summary["stage"] == "fit" and summary["policies"]["learned"]["token_fraction_mean"] > 0
