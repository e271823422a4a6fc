"""One run, one folder, and nothing contradictory accepted: a second fit into a run's folder, two runs
at once, validate / test / predict beside a run, checkpoints cut short by a full disk, settings that
contradict each other, and the last unclear or buried messages. Each ends as one line (exit 2, no
traceback, the setting or file named) or as a clean resume, and no file of another run changes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splitlab.cli import lightning_main
from splitlab.cli.runs import LOCK, RunLock
from tests.helpers import REPO, schedule_args, tiny_args
from tests.pipelines.test_bad_input import fails, untrained


def digest(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def run(shapes_root, tmp_path_factory) -> Path:
    """A finished tiny fit (one warm-start epoch) in a folder of its own."""
    folder = tmp_path_factory.mktemp("run")
    lightning_main(["fit", *tiny_args(shapes_root, folder, *schedule_args(1, 0))])
    assert not (folder / LOCK).exists()  # released when the fit ended
    return folder


def test_a_second_fit_into_a_runs_folder_is_refused(run, shapes_root, capsys) -> None:
    before = digest(run)
    fails(
        capsys,
        ["fit", *tiny_args(shapes_root, run, *schedule_args(1, 0))],
        f"{run} already holds a run (metrics.csv, hparams.yaml, summary.json, checkpoints/",
        "resume it with --ckpt_path last",
        "--trainer.logger.init_args.version=",
    )
    assert digest(run) == before


def test_evaluation_beside_a_run_writes_into_its_own_folder(run, shapes_root) -> None:
    before = digest(run)
    ckpt = run / "checkpoints" / "last.ckpt"
    for command in ("validate", "test", "validate"):
        lightning_main([command, *tiny_args(shapes_root, run), f"--ckpt_path={ckpt}"])
    assert {k: v for k, v in digest(run).items() if k in before} == before
    for folder in ("validate", "test", "validate-1"):
        summary = json.loads((run / folder / "summary.json").read_text())
        assert summary["stage"] == folder.split("-")[0]


def test_a_live_lock_refuses_a_second_run_and_a_dead_one_is_taken_over(shapes_root, tmp_path, capsys) -> None:
    folder = tmp_path / "busy"
    folder.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = RunLock(folder)
        (folder / LOCK).write_text(json.dumps({**lock.owner(), "pid": other.pid, "job": None}))
        fails(
            capsys,
            ["fit", *tiny_args(shapes_root, folder, *schedule_args(1, 0))],
            f"{folder}: another run is writing there (pid {other.pid}",
            f"delete {folder / LOCK}",
        )
        assert untrained(folder)
    finally:
        other.kill()
        other.wait()
    lock.acquire()  # its holder is gone: taken over
    assert json.loads((folder / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / LOCK).exists()


def test_a_checkpoint_cut_short_leaves_the_last_whole_and_last_skips_an_unreadable_one(
    run, shapes_root, monkeypatch, tmp_path, recwarn
) -> None:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from splitlab.callbacks import VerifiedCheckpointIO

    target = tmp_path / "last.ckpt"
    target.write_bytes(b"the previous checkpoint")

    def full_disk(self, checkpoint, path, storage_options=None):
        Path(path).write_bytes(b"half a chec")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", full_disk)
    with pytest.raises(OSError, match="could not be written"):
        VerifiedCheckpointIO(retries=0).save_checkpoint({"x": 1}, target)
    assert target.read_bytes() == b"the previous checkpoint" and not list(tmp_path.glob("*.partial"))
    monkeypatch.undo()

    # a truncated newest checkpoint (an older splitlab's cut-short save): --ckpt_path last takes the
    # newest one that reads, with a warning
    copy = tmp_path / "copy"
    (copy / "checkpoints").mkdir(parents=True)
    good = copy / "checkpoints" / "epoch=0-step=9.ckpt"
    good.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes())
    (copy / "checkpoints" / "last.ckpt").write_bytes(good.read_bytes()[:1000])
    os.utime(good, (1, 1))
    cli = lightning_main(["validate", *tiny_args(shapes_root, copy), "--ckpt_path=last"])
    assert cli.config["validate"]["ckpt_path"] == str(good)
    assert any("skipping" in str(w.message) and "last.ckpt" in str(w.message) for w in recwarn)
    assert json.loads((copy / "validate" / "summary.json").read_text())["stage"] == "validate"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--model.init_args.max_fraction=0.6", "--model.init_args.evaluation.eval_budgets=[0.7]"],
            "max_fraction=0.6 is below eval_budgets=0.7: a cap under the budget",
        ),
        (["--data.init_args.root={bad}"], "class folder(s) ['checks'] in train/ hold no image files"),
    ],
    ids=["eval-budget-above-cap", "class-folder-of-text"],
)
def test_settings_and_data_that_cannot_work(shapes_root, tmp_path, capsys, extra, message) -> None:
    import shutil

    bad = tmp_path / "data"
    shutil.copytree(shapes_root, bad)
    folder = bad / "train" / "checks"
    for image in folder.iterdir():
        image.unlink()
    (folder / "notes.txt").write_text("no images here")
    args = [e.format(bad=bad) for e in extra]
    fails(capsys, ["fit", *tiny_args(shapes_root, tmp_path / "run", *schedule_args(1, 1), *args)], message)


def test_mask_rcnn_without_masks_is_refused(tmp_path) -> None:
    from types import SimpleNamespace

    from splitlab.tasks import DetectionTask
    from tests.tasks.test_per_image_loss import TINY

    task = DetectionTask(
        num_classes=3, detector={"name": "mask_rcnn"}, pyramid_channels=16, pyramid_indices=[1], **TINY
    )
    data = SimpleNamespace(hparams={"masks": False}, img_size=64, num_classes=3)
    with pytest.raises(
        ValueError, match="detector.name=mask_rcnn learns from instance masks, but data.init_args.masks=false"
    ):
        task.check_data(data)


def test_a_config_that_is_not_yaml_names_its_file_and_line(shapes_root, tmp_path, capsys) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text("trainer:\n  max_epochs: [1\n")
    fails(
        capsys,
        ["fit", *tiny_args(shapes_root, tmp_path / "run"), "--config", str(bad)],
        f"--config {bad}: not valid YAML at line 3",
    )


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "from splitlab.backbone import create_vit; create_vit('vit_tiny_patch16_224', pretrained=True)",
            "model_name='vit_tiny_patch16_224': its pretrained weights could not be loaded",
        ),
        (
            "from splitlab.data.hf import load_hf_splits; load_hf_splits('ILSVRC/imagenet-1kk')",
            "data.hf_dataset='ILSVRC/imagenet-1kk': could not be loaded",
        ),
    ],
    ids=["pretrained-weights", "hf-dataset-typo"],
)
def test_offline_hub_errors_are_one_line_within_seconds(code, message) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    script = f"from splitlab.cli import reporting_errors\nreporting_errors(lambda: exec({code!r}))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert message in done.stderr and "HF_HUB_OFFLINE" in done.stderr


def test_sub_pixel_boxes_are_counted_and_empty_labels_are_no_score(tmp_path) -> None:
    from splitlab.backbone import PackedViT
    from splitlab.data import generate_coco
    from splitlab.data.detection import CocoDetection, letterbox
    from splitlab.metrics import FineCoverage
    from splitlab.model import Preprocessing
    from splitlab.tokenizer import SplitTokenizer
    from tests.helpers import layout_of

    root = generate_coco(tmp_path / "coco", img_size=64, train=2, val=2)
    path = root / "annotations" / "instances_train2017.json"
    doc = json.loads(path.read_text())
    doc["annotations"][0]["bbox"] = [10, 10, 0.4, 5]  # 0.4 px wide: nothing to train on
    path.write_text(json.dumps(doc))
    prep = Preprocessing(64)
    with pytest.warns(
        UserWarning, match="1 box\\(es\\) under a pixel at the network's input size \\(64 px\\)"
    ):
        CocoDetection(
            root / "train2017", path, letterbox(prep, True), masks=False, img_size=64, training=True
        )

    coverage = FineCoverage(16, ignore_index=255)
    vit = PackedViT("test_vit", img_size=64, depth=1)
    tok = SplitTokenizer(vit.embed_dim, (64, 32, 16))
    images = torch.randn(2, 3, 64, 64)
    coverage.update(layout_of("uniform", tok, vit, images), torch.full((2, 64, 64), 255))
    values = coverage.compute()
    assert int(values["labelled_pixels"]) == 0 and torch.isnan(values["object_fine_coverage"])
    from tests.tasks.test_per_image_loss import segmentation

    task, _ = segmentation()
    row = {"miou": 0.0, "pixel_accuracy": 0.0, "object_fine_coverage": 0.0, "labelled_pixels": 0.0}
    with pytest.warns(UserWarning, match="no labelled pixels"):
        done = task.logic.finish_results({"learned": dict(row), "uniform": {**row, "labelled_pixels": 5.0}})
    assert all(v != v for v in done["learned"].values()) and "labelled_pixels" not in done["learned"]
    assert done["uniform"]["miou"] == 0.0


def test_the_vqa_vocabulary_of_any_vqav2_folder(tmp_path, capsys) -> None:
    from splitlab.commands import main
    from splitlab.data import generate_vqa
    from splitlab.heads.vqa import build_tokenizer

    root = generate_vqa(tmp_path / "vqa", img_size=48, train=4, val=2, seed=0)
    made = json.loads((root / "vocab.json").read_text())
    (root / "vocab.json").unlink()
    with pytest.raises(FileNotFoundError, match="splitlab data vqa-vocab DATA_ROOT"):
        build_tokenizer(str(root / "vocab.json"))
    with pytest.raises(SystemExit) as stop:
        main(["data", "vqa-vocab", str(root)])
    assert stop.value.code == 0 and "wrote" in capsys.readouterr().out
    words = json.loads((root / "vocab.json").read_text())
    assert set(made) <= set(words) and {"answer", "single", "phrase"} <= set(words)  # the prompt's words too
