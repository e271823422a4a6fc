"""`splitlab.checkpoint`: no path that reads a checkpoint runs what the file holds. A copy of a real
run's checkpoint with a pickled object that runs a shell command when unpickled (what an attacker
puts into a file users download) is refused by every reader, naming the file and the object, and
the command never runs; a file that does not read says what it is; a trusted file converts once."""

from __future__ import annotations

import argparse
import fractions
import json
import os
import shlex
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

import splitlab
from splitlab.checkpoint import UnreadableCheckpoint, UnsafeCheckpoint, read_checkpoint
from splitlab.cli import lightning_main
from splitlab.commands import main
from splitlab.distributed import BlockFSDPStrategy
from splitlab.rl import PPOConfig
from splitlab.tasks import load_task
from tests.helpers import fit, schedule_args, tiny_args

SYSTEM = f"{os.system.__module__}.system"  # how the pickle names os.system (posix.system on Linux)


class Payload:
    """Unpickled, it runs ``touch <marker>`` (``os.system``): what a malicious checkpoint carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


@pytest.fixture(scope="module")
def run(shapes_root, tmp_path_factory) -> Path:
    """A real run of the tiny classification twin (one warm-start epoch): config.yaml, checkpoints/."""
    folder = tmp_path_factory.mktemp("run")
    fit(shapes_root, folder, *schedule_args(1, 0), "--model.init_args.evaluation.eval_baselines=[]")
    return folder


@pytest.fixture
def evil(run, tmp_path) -> tuple[Path, Path]:
    """A copy of the run's last.ckpt with a `Payload` among its hyperparameters, and the file the
    payload would create."""
    marker = tmp_path / "payload-ran"
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["note"] = Payload(marker)
    path = tmp_path / "evil.ckpt"
    torch.save(checkpoint, path)
    return path, marker


def images(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir(exist_ok=True)
    for i in range(2):
        Image.new("RGB", (64, 64), (60 * i, 90, 120)).save(folder / f"{i}.png")
    return folder


def command(argv: list[str], capsys) -> str:
    """The one line a splitlab command refuses with (exit code 2)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err[-2000:]
    return err


def python_fit_resume(shapes_root: Path, out: Path, ckpt: Path) -> None:
    """``Trainer.fit(..., ckpt_path=...)`` from Python: Lightning's own read of the file."""
    cli = lightning_main(tiny_args(shapes_root, out), run=False)
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=str(ckpt))


def resume_last(shapes_root: Path, out: Path, ckpt: Path, capsys) -> str:
    """``--ckpt_path last`` in a run folder whose newest checkpoint is ``ckpt``."""
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy(ckpt, out / "checkpoints" / "last.ckpt")
    return command(["fit", *tiny_args(shapes_root, out), "--ckpt_path=last"], capsys)


# every path that reads a checkpoint: how it is given the file, as a user gives it
READERS = {
    "init_checkpoint": lambda e, r, s, t, c: command(
        ["fit", *tiny_args(s, t / "out", f"--model.init_args.init_checkpoint={e}")], c
    ),
    "fit --ckpt_path (resume)": lambda e, r, s, t, c: command(
        ["fit", *tiny_args(s, t / "out"), f"--ckpt_path={e}"], c
    ),
    "fit --ckpt_path last": lambda e, r, s, t, c: resume_last(s, t / "out", e, c),
    "validate --ckpt_path": lambda e, r, s, t, c: command(
        ["validate", *tiny_args(s, t / "out"), f"--ckpt_path={e}"], c
    ),
    "Trainer.fit(ckpt_path=...)": lambda e, r, s, t, c: python_fit_resume(s, t / "out", e),
    "BlockFSDPStrategy (Lightning's FSDP reader)": lambda e, r, s, t, c: BlockFSDPStrategy().load_checkpoint(
        e
    ),
    "splitlab.load": lambda e, r, s, t, c: splitlab.load(e),
    "load_task": lambda e, r, s, t, c: load_task(e),
    "predict": lambda e, r, s, t, c: command(
        ["predict", str(e), str(images(t)), "--out", str(t / "p"), "--num-workers", "0"], c
    ),
    "bench --ckpt": lambda e, r, s, t, c: command(["bench", "--ckpt", str(e), "--iters", "1"], c),
    "export": lambda e, r, s, t, c: command(["export", str(e), "--out", str(t / "x")], c),
    "calibrate": lambda e, r, s, t, c: command(
        ["calibrate", str(e), str(images(t)), "--out", str(t / "cal"), "--num-workers", "0"], c
    ),
    "curve": lambda e, r, s, t, c: command(
        ["curve", str(r), "--ckpt", str(e), "--out", str(t / "curve"), "--eval-budgets", "0.5"], c
    ),
    "policy_checkpoint (transferred)": lambda e, r, s, t, c: command(
        [
            "fit",
            *tiny_args(s, t / "out"),
            "--model.init_args.budget_range=null",
            "--model.init_args.policy=transferred",
            f"--model.init_args.policy_options.policy_checkpoint={e}",
        ],
        c,
    ),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_no_reader_runs_a_pickled_object(reader, evil, run, shapes_root, tmp_path, capsys) -> None:
    path, marker = evil
    try:
        said = READERS[reader](path, run, shapes_root, tmp_path, capsys)
    except UnsafeCheckpoint as refused:
        said = str(refused)
        assert refused.objects[0] == SYSTEM
    assert not marker.exists(), f"{reader} ran the checkpoint's payload"
    if reader == "fit --ckpt_path last":  # the copy in the run folder is the file named
        path = tmp_path / "out" / "checkpoints" / "last.ckpt"
    assert str(path) in said and f"holds objects other than weights and settings ({SYSTEM})" in said, said
    assert "splitlab convert-checkpoint" in said  # and how a user who trusts the file converts it


def test_what_splitlab_and_lightning_write_reads_weights_only(run, tmp_path) -> None:
    """Every checkpoint of the run, and one of a task built in Python (its ``ppo`` a `PPOConfig`, its
    data root a ``Path``), reads weights-only, and loads as a task and as a model."""
    for saved in (run / "checkpoints").glob("*.ckpt"):
        assert read_checkpoint(saved, "ckpt_path")["splitlab"]["stage"]
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["ppo"] = PPOConfig(**checkpoint["hyper_parameters"]["ppo"])
    checkpoint["datamodule_hyper_parameters"]["root"] = Path(
        checkpoint["datamodule_hyper_parameters"]["root"]
    )
    path = tmp_path / "python.ckpt"
    torch.save(checkpoint, path)
    assert isinstance(read_checkpoint(path, "ckpt_path")["hyper_parameters"]["ppo"], PPOConfig)
    task = load_task(path)
    assert isinstance(task.hparams.ppo, PPOConfig) and task.stage == checkpoint["splitlab"]["stage"]
    assert splitlab.load(path).names == splitlab.load(run).names


def test_a_trusted_checkpoint_converts_once_and_then_loads(run, tmp_path, capsys) -> None:
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["extra"] = argparse.Namespace(
        root=Path("/data"), ratio=fractions.Fraction(1, 3)
    )
    source, target = tmp_path / "trusted.ckpt", tmp_path / "trusted-weights.ckpt"
    torch.save(checkpoint, source)
    with pytest.raises(UnsafeCheckpoint, match=r"\(argparse\.Namespace") as refused:
        splitlab.load(source)
    assert f"splitlab convert-checkpoint {source} {target}" in str(refused.value)
    with (
        pytest.raises(SystemExit) as stop,
        pytest.warns(UserWarning, match=r"extra\.ratio \(a fractions\.Fraction\)"),
    ):
        main(["convert-checkpoint", str(source), str(target)])
    assert stop.value.code == 0 and f"wrote {target}" in capsys.readouterr().out
    assert read_checkpoint(target, "ckpt_path")["hyper_parameters"]["extra"] == {"root": "/data"}
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(splitlab.load(target)(x)[0], splitlab.load(run)(x)[0])
    assert command(["convert-checkpoint", str(source), str(target)], capsys).endswith(
        f"{str(target)!r} exists; give a new file to write\n"
    )


def safetensors_file(path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(3)}, path)


def zip_without_pickle(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/weights.bin", b"\0" * 16)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p, good: p.write_bytes(b""), "the file is empty (0 bytes)"),
        (
            lambda p, good: p.write_bytes(good.read_bytes()[:5000]),
            "truncated: 5,000 bytes of a checkpoint (a zip",
        ),
        (lambda p, good: zip_without_pickle(p), "a zip archive without data.pkl"),
        (lambda p, good: safetensors_file(p), "a safetensors file"),
        (lambda p, good: p.write_text(json.dumps({"budget": 0.5})), "JSON text"),
        (lambda p, good: Image.new("RGB", (4, 4)).save(p, format="PNG"), "a PNG image, not a checkpoint"),
        (lambda p, good: p.write_text("<!DOCTYPE html><title>Sign in</title>"), "an HTML page"),
        (
            lambda p, good: p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0"),
            "a Git LFS pointer",
        ),
        (
            lambda p, good: p.write_text("epoch 3, loss 0.2\n"),
            "a text file (18 bytes, beginning 'epoch 3, loss 0.2')",
        ),
    ],
    ids=["empty", "truncated", "zip", "safetensors", "json", "image", "html", "lfs", "text"],
)
def test_a_file_that_does_not_read_says_what_it_is(make, said, run, tmp_path) -> None:
    path = tmp_path / "model.ckpt"
    make(path, run / "checkpoints" / "last.ckpt")
    with pytest.raises(UnreadableCheckpoint) as refused:
        splitlab.load(path)
    assert str(refused.value).startswith(f"model={str(path)!r} is not a readable checkpoint: ")
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_an_init_checkpoint_of_another_backbone_names_the_settings_that_differ(
    run, shapes_root, tmp_path, capsys
):
    said = command(
        [
            "fit",
            *tiny_args(
                shapes_root,
                tmp_path / "out",
                f"--model.init_args.init_checkpoint={run / 'checkpoints' / 'last.ckpt'}",
            ),
            "--model.init_args.backbone_kwargs.embed_dim=48",
        ],
        capsys,
    )
    assert "was trained with other sizes" in said
    assert '; its settings differ: backbone_kwargs {"img_size": 64, "patch_size": 8, "embed_dim": 32' in said
    assert '(this model: {"img_size": 64, "patch_size": 8, "embed_dim": 48' in said
