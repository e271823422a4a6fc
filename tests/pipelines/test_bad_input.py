"""Bad settings, bad data and faults, tried as a user would (the `splitlab` command, in process): each
ends as one clear message that names the setting or file, with a non-zero exit and no traceback,
before any training; or as an explicit skip with a count; or as a clean stop and resume."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from splitlab.commands import main
from tests.helpers import schedule_args, tiny_args, twin_configs


def fails(capsys: pytest.CaptureFixture, argv: list[str], *expected: str) -> str:
    """Run ``splitlab argv``; assert a non-zero exit, no traceback, and every expected fragment."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code not in (0, None), err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    for fragment in expected:
        assert fragment in err, f"{fragment!r} not in:\n{err[-2000:]}"
    return err


TRAINING_STEPS = [0]  # training steps run since the test began (counted by `count_training_steps`)


@pytest.fixture(autouse=True)
def count_training_steps(monkeypatch):
    """Count every task's training steps, so that `untrained` can tell a failure before training from
    one inside epoch 0 (which writes no checkpoint either)."""
    from splitlab.tasks.hooks import TaskHooks

    step = TaskHooks.training_step

    def counted(self, *args, **kwargs):
        TRAINING_STEPS[0] += 1
        return step(self, *args, **kwargs)

    TRAINING_STEPS[0] = 0
    monkeypatch.setattr(TaskHooks, "training_step", counted)


def untrained(log_dir) -> bool:
    """Nothing was trained: no training step ran since the test began (or since the last reset of
    `TRAINING_STEPS`) and no checkpoint was written."""
    return TRAINING_STEPS[0] == 0 and not list(log_dir.rglob("*.ckpt"))


def fit_args(root, log_dir, *extra: str) -> list[str]:
    return ["fit", *tiny_args(root, log_dir, *schedule_args(1, 1), *extra)]


# ------------------------------------------------------------------------------------- settings
SETTINGS = [
    (
        "--model.init_args.budget=0.05",
        "budget=0.05 is outside the range levels=(32, 16, 8) can reach",
    ),
    (
        "--model.init_args.backbone=vit_nonexistent_patch16",
        "model_name='vit_nonexistent_patch16' is not a timm model",
    ),
    (
        "--model.init_args.tokenizer.levels=[32,24,8]",
        "levels=(32, 24, 8): each level must be exactly half the previous one",
    ),
    (
        "--model.init_args.tokenizer.levels=[64,32,16]",
        "the finest level must equal the backbone's patch size (8)",
    ),
    (
        "--model.init_args.tokenizer.levels=[32,16]",
        "the finest level must equal the backbone's patch size (8)",
    ),
    (
        "--model.init_args.backbone_kwargs.attn_backend=turbo",
        "attn_backend='turbo': expected 'auto' or one of",
    ),
    ("--model.init_args.evaluation.eval_baselines=[apt]", "eval_baselines=['apt']: unknown ['apt']"),
    (
        "--data.init_args.objects=null",
        "eval_baselines with oracle need annotations that say where the objects are, and this data gives none",
    ),
    (
        "--model.init_args.tokenizer.decision_context=neighbours",
        "decision_context='neighbours': expected one of",
    ),
    (
        "--model.init_args.tokenizer.decision_features=conv",
        "decision_features='conv': expected one of ('linear', 'mlp')",
    ),
    ("--model.init_args.warm_start.label_source=boxes", "label_source='boxes': expected one of"),
    ("--data.init_args.objects=nowhere.json", "data.init_args.objects="),
    (
        "--model.init_args.budget_range=[0.7,0.3]",
        "budget_range=[0.7, 0.3]: the lowest budget must be below the highest",
    ),
    ("--model.init_args.budget_range=[0.01,0.5]", "budget_points=0.01 is outside the range"),
    ("--model.init_args.max_fraction=0.05", "max_fraction=0.05 is outside the range"),
    ("--model.init_args.max_fraction=0.3", "max_fraction=0.3 is below budget=0.5"),
    (
        "--model.init_args.budget_range=[0.3,1.2]",
        "budget_range=[0.3, 1.2]: budgets are token fractions in (0, 1]",
    ),
    (
        "--model.init_args.global_pool=map",
        "global_pool='map': the backbone was built with global_pool='token' and timm cannot change it",
    ),
    (
        "--model.init_args.evaluation.eval_budgets=[0.9]",
        "eval_budgets=0.9: this policy was trained for budgets [0.3, 0.7]",
    ),
    (
        "--model.init_args.budget=0.8",
        "budget=0.8: this policy was trained for budgets [0.3, 0.7]",
    ),
    ("--model.init_args.tokenizer.decision_dim=15", "decision_dim=15 must be divisible by decision_heads=2"),
    ("--model.init_args.global_pool=gem", "global_pool='gem': expected one of ('token', 'avg'"),
    ("--model.init_args.budget=abc", 'Parser key "budget"'),
    (
        "--model.init_args.init_checkpoint=/no/such.ckpt",
        "init_checkpoint='/no/such.ckpt': no such checkpoint file",
    ),
    (
        "--trainer.max_epochs=1",
        "dense_epochs + warm_start_epochs + rl_epochs = 0 + 1 + 1 = 2 is above trainer.max_epochs=1",
    ),
    ("--model.init_args.num_classes=3", "the data has 4 classes but model.init_args.num_classes=3"),
    ("--model.init_args.num_classes=7", "the data has 4 classes but model.init_args.num_classes=7"),
    (
        "--data.init_args.img_size=32",
        "data.init_args.img_size=32 (in the command line) differs from the model's 64: the data's follows the model's, "
        "so set model.init_args.backbone_kwargs.img_size",
    ),
    ("--data.init_args.root=/no/such/dataset", "data.root='/no/such/dataset': no such directory"),
    ("--data.init_args.train_split=training", "data.root/train_split="),
    ("--trainer.precision=16-true", "trainer.precision=16-true: float16 training is not supported"),
    ("--model.init_args.optim.lr=-1", "model.init_args.optim.lr=-1.0: must be a finite number above 0"),
    ("--model.init_args.ppo.clip=0", "model.init_args.ppo.clip=0.0: must be a finite number above 0"),
    (
        "--model.init_args.target_fraction=0.5",
        "model.init_args.target_fraction was renamed model.init_args.budget (CHANGELOG.md",
    ),
    ("--model.init_args.lambda_init=0.1", "renamed model.init_args.controller.init"),
    ("--model.init_args.warm_start.foo=1", "unrecognized arguments: --model.init_args.warm_start.foo=1"),
    (
        "--model.init_args.evaluation.eval_budgets=null",
        "write an empty list (--model.init_args.evaluation.eval_budgets=[])",
    ),
]


@pytest.mark.parametrize(
    ("setting", "message"),
    SETTINGS,
    ids=[s.split("=")[0].split(".")[-1] + str(i) for i, (s, _) in enumerate(SETTINGS)],
)
def test_a_bad_setting_is_one_clear_message(shapes_root, tmp_path, capsys, setting, message) -> None:
    fails(capsys, fit_args(shapes_root, tmp_path, setting), message)
    assert untrained(tmp_path)


def test_a_bad_schedule_is_one_clear_message(shapes_root, tmp_path, capsys) -> None:
    callbacks = [{"class_path": "splitlab.callbacks.SplitSchedule", "init_args": {"rl_epochs": -1}}]
    args = tiny_args(shapes_root, tmp_path, f"--trainer.callbacks={json.dumps(callbacks)}")
    fails(capsys, ["fit", *args], "rl_epochs=-1 must be >= 0")


def test_an_init_checkpoint_of_another_model(shapes_root, tmp_path, capsys) -> None:
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"model.backbone.model.nonsense": torch.zeros(3)}}, other)
    fails(
        capsys,
        fit_args(shapes_root, tmp_path, f"--model.init_args.init_checkpoint={other}"),
        f"init_checkpoint='{other}' does not fit this model",
    )


def wide_checkpoint(path) -> str:
    """Same weights, other shapes (e.g. a dense stage with another width or ``lm``)."""
    torch.save({"state_dict": {"model.backbone.model.cls_token": torch.zeros(1, 1, 48)}}, path)
    return "was trained with other sizes: model.backbone.model.cls_token (1, 1, 48)"


def cut_checkpoint(path) -> str:
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:300])
    return "is not a readable checkpoint"


@pytest.mark.parametrize("make", [wide_checkpoint, cut_checkpoint], ids=["other-sizes", "truncated"])
def test_an_init_checkpoint_that_cannot_load(shapes_root, tmp_path, capsys, make) -> None:
    path = tmp_path / "init.ckpt"
    message = make(path)
    args = fit_args(shapes_root, tmp_path / "logs", f"--model.init_args.init_checkpoint={path}")
    fails(capsys, args, f"init_checkpoint='{path}' {message}")
    assert untrained(tmp_path / "logs")


# ------------------------------------------------------------------------------------- data
def test_an_empty_class_folder(shapes_root, tmp_path, capsys) -> None:
    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    for f in (root / "val" / "dots").iterdir():
        f.unlink()
    fails(capsys, fit_args(root, tmp_path / "logs"), "class folder(s) ['dots'] in val/ hold no image files")


def test_a_missing_hf_column(tmp_path, capsys) -> None:
    from splitlab.data import generate_shapes

    path = generate_shapes(tmp_path / "hf", train=2, val=1, test=1, fmt="hf")
    hf = [
        "--data.init_args.root=null",
        f"--data.init_args.hf_dataset={path}",
        "--data.init_args.objects=null",
    ]
    args = fit_args(path, tmp_path / "logs", *hf)
    fails(
        capsys,
        [*args, "--data.init_args.val_split=validation", "--data.init_args.image_column=img"],
        "no column ['img']",
    )


def test_a_corrupt_image_is_skipped_counted_and_reported(shapes_root, tmp_path, capsys, recwarn) -> None:
    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    bad = sorted((root / "train" / "checks").glob("*.png"))[0]
    bad.write_bytes(b"not a png")
    main(fit_args(root, tmp_path / "logs"))
    messages = [str(w.message) for w in recwarn]
    assert any(f"skipping {bad}" in m for m in messages)
    assert any("read(s) of unusable samples (" in m and " in train)" in m for m in messages)
    assert TRAINING_STEPS[0] > 0  # the count sees training
    # `strict` stops at the first read of the bad image, inside the epoch (images are checked by
    # reading them, which only training does for every one): named, before any checkpoint
    with pytest.raises(SystemExit):
        main(fit_args(root, tmp_path / "strict", "--data.init_args.strict=true"))
    assert f"{bad}" in capsys.readouterr().err and not list((tmp_path / "strict").rglob("*.ckpt"))


def twin_args(task: str, root, log_dir, *extra: str) -> list[str]:
    """``fit`` of a dense CI twin on ``root``, logging under ``log_dir``."""
    return [
        "fit",
        *twin_configs(task),
        f"--data.init_args.root={root}",
        f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


def coco_args(root, log_dir, *extra: str) -> list[str]:
    return twin_args("coco", root, log_dir, *extra)


def edited_coco(coco_root, tmp_path, edit) -> object:
    root = tmp_path / "coco"
    shutil.copytree(coco_root, root)
    path = root / "annotations" / "instances_train2017.json"
    doc = json.loads(path.read_text())
    edit(doc, root)
    path.write_text(json.dumps(doc))
    return root


COCO = [
    (
        "orphan",
        lambda d, r: d["annotations"][0].update(image_id=4242),
        "name an image_id that is not among the images, e.g. annotation id 1 with image_id 4242",
    ),
    (
        "category",
        lambda d, r: d["annotations"][0].update(category_id=7),
        "name a category_id that is not among the categories [1, 2, 3], e.g. annotation id 1 with category_id 7",
    ),
    (
        "missing-image",
        lambda d, r: (r / "train2017" / "000000000001.png").unlink(),
        "names 1 image(s) missing from",
    ),
    (
        "malformed",
        lambda d, r: d.update(images=[{"id": 1}], annotations=[{"image_id": 1}]),
        "malformed COCO annotations",
    ),
    (
        "no-file-name",
        lambda d, r: d["images"][0].pop("file_name"),
        "an entry of 'images' lacks ['file_name'] (COCO's instances format)",
    ),
    (
        "no-bbox",
        lambda d, r: d["annotations"][0].pop("bbox"),
        "an entry of 'annotations' lacks ['bbox'] (COCO's instances format)",
    ),
    (
        "no-size",
        lambda d, r: next(i for i in d["images"] if i["id"] == d["annotations"][0]["image_id"]).pop("width"),
        "has annotations but no width and height",
    ),
    (
        "num-classes",
        lambda d, r: (d["categories"].append({"id": 9, "name": "extra"}), val_doc(r, d["categories"])),
        "the data has 4 classes but model.init_args.num_classes=3",
    ),
    (
        "categories-differ",
        lambda d, r: d["categories"][0].update(name="renamed"),
        "instances_val2017.json list different categories (3 vs 3; e.g.",
    ),
]


def val_doc(root, categories=None) -> dict:
    """The validation annotations (with ``categories``: rewritten with those categories)."""
    path = root / "annotations" / "instances_val2017.json"
    doc = json.loads(path.read_text())
    if categories is not None:
        path.write_text(json.dumps({**doc, "categories": categories}))
    return doc


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in COCO], ids=[c[0] for c in COCO])
def test_bad_coco_annotations_stop_before_training(coco_root, tmp_path, capsys, edit, message) -> None:
    root = edited_coco(coco_root, tmp_path, edit)
    fails(capsys, coco_args(root, tmp_path / "logs"), message)
    assert untrained(tmp_path / "logs")


@pytest.mark.parametrize(("text", "message"), [("[]", "not a JSON object"), ('{"images": [', "not JSON")])
def test_a_coco_file_that_is_not_a_coco_document(coco_root, tmp_path, capsys, text, message) -> None:
    root = tmp_path / "coco"
    shutil.copytree(coco_root, root)
    (root / "annotations" / "instances_train2017.json").write_text(text)
    fails(
        capsys,
        coco_args(root, tmp_path / "logs"),
        "instances_train2017.json: malformed COCO annotations",
        message,
    )
    assert untrained(tmp_path / "logs")


def test_a_non_square_detection_input_is_refused_naming_the_models_setting(
    coco_root, tmp_path, capsys
) -> None:
    """Classification takes a non-square input; the letterboxing readers pad to a square and say so."""
    fails(
        capsys,
        coco_args(coco_root, tmp_path / "logs", "--model.init_args.backbone_kwargs.img_size=[128,96]"),
        "model.init_args.backbone_kwargs.img_size=[128, 96]: a detection model letterboxes images into a square",
        "(img_size: 128)",
    )
    assert untrained(tmp_path / "logs")


def test_a_missing_coco_annotation_file(coco_root, tmp_path, capsys) -> None:
    root = tmp_path / "coco"
    shutil.copytree(coco_root, root)
    (root / "annotations" / "instances_val2017.json").unlink()
    fails(capsys, coco_args(root, tmp_path / "logs"), "instances_val2017.json: no such annotation file")


def ade_args(root, log_dir, *extra: str) -> list[str]:
    return twin_args("ade20k", root, log_dir, "--data.init_args.batch_size=4", *extra)


def edit_mask(root, index: int, edit) -> str:
    path = sorted((root / "annotations" / "training").glob("*.png"))[index]
    mask = np.asarray(Image.open(path)).copy()
    Image.fromarray(edit(mask)).save(path)
    return path.name


def test_an_early_ade_label_above_num_classes_stops_before_training(ade_root, tmp_path, capsys) -> None:
    root = tmp_path / "ade"
    shutil.copytree(ade_root, root)
    name = edit_mask(root, 0, lambda m: np.where(m == m.flat[0], 9, m).astype(np.uint8))
    fails(capsys, ade_args(root, tmp_path / "logs"), name, "label value 9 is above num_classes=5")
    assert untrained(tmp_path / "logs")


def test_a_mask_of_another_size_stops_before_training(ade_root, tmp_path, capsys) -> None:
    root = tmp_path / "ade"
    shutil.copytree(ade_root, root)
    name = edit_mask(root, 17, lambda m: m[:64])
    fails(capsys, ade_args(root, tmp_path / "logs"), name, "differs from its image")
    assert untrained(tmp_path / "logs")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "--data.init_args.ignore_index=0",
            "data.init_args.ignore_index=0 but model.init_args.ignore_index=255",
        ),
        ("--data.init_args.batch_size=1", "data.init_args.batch_size=1: the decode head's BatchNorm needs"),
    ],
    ids=["ignore-index", "batch-of-one"],
)
def test_segmentation_settings_that_cannot_work_stop_before_training(
    ade_root, tmp_path, capsys, setting, message
) -> None:
    fails(capsys, ade_args(ade_root, tmp_path / "logs", setting), message)
    assert untrained(tmp_path / "logs")


def test_a_late_bad_ade_label_is_skipped_and_counted(ade_root, tmp_path, recwarn) -> None:
    root = tmp_path / "ade"
    shutil.copytree(ade_root, root)
    name = edit_mask(root, 18, lambda m: np.full_like(m, 9))  # beyond the masks checked up front
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 1, "rl_epochs": 0},
        }
    ]
    main(
        ade_args(
            root, tmp_path / "logs", "--trainer.max_epochs=1", f"--trainer.callbacks={json.dumps(callbacks)}"
        )
    )
    messages = [str(w.message) for w in recwarn]
    assert any(name in m and "label value 9" in m for m in messages)
    assert any("read(s) of unusable samples (" in m for m in messages)


def test_a_missing_annotation_folder(ade_root, tmp_path, capsys) -> None:
    root = tmp_path / "ade"
    shutil.copytree(ade_root, root)
    shutil.rmtree(root / "annotations" / "validation")
    fails(capsys, ade_args(root, tmp_path / "logs"), "data.root/annotations/validation=")


# ------------------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def trained(shapes_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    main(["fit", *tiny_args(shapes_root, out, *schedule_args(1, 1))])
    return out / "checkpoints" / "last.ckpt"


def test_a_missing_checkpoint(shapes_root, tmp_path, capsys) -> None:
    fails(
        capsys,
        ["validate", *tiny_args(shapes_root, tmp_path), "--ckpt_path=/no/such.ckpt"],
        "ckpt_path='/no/such.ckpt': no such checkpoint file",
    )


def test_a_truncated_checkpoint(shapes_root, trained, tmp_path, capsys) -> None:
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(trained.read_bytes()[:1000])
    fails(
        capsys,
        ["validate", *tiny_args(shapes_root, tmp_path), f"--ckpt_path={broken}"],
        f"ckpt_path='{broken}' is not a readable checkpoint",
    )


def test_last_with_nothing_to_resume(shapes_root, tmp_path, capsys) -> None:
    fails(
        capsys,
        [*fit_args(shapes_root, tmp_path), "--ckpt_path=last"],
        "ckpt_path=last: no checkpoint under",
        "nothing to resume",
    )


def test_a_resume_with_changed_training_settings_is_refused(shapes_root, trained, tmp_path, capsys) -> None:
    args = [
        *fit_args(
            shapes_root,
            tmp_path,
            "--model.init_args.optim.lr=0.002",
            "--model.init_args.budget_range=[0.2,0.7]",
        ),
        f"--ckpt_path={trained}",
    ]
    fails(
        capsys,
        args,
        "cannot change now",
        "optim.lr: checkpoint 0.0005, given 0.002",
        "budget_range: checkpoint [0.3, 0.7], given [0.2, 0.7]",
    )


def test_a_resume_with_another_batch_size_is_refused(shapes_root, trained, tmp_path, capsys) -> None:
    """The batch size and shuffling seed fix where a mid-epoch resume continues; a moved data root
    (another machine, the same data) is fine."""
    args = [*fit_args(shapes_root, tmp_path, "--data.init_args.batch_size=4"), f"--ckpt_path={trained}"]
    fails(
        capsys,
        args,
        "data.init_args.batch_size: checkpoint 8, given 4",
        "resume with the checkpoint's values",
    )
    assert untrained(tmp_path)
    from splitlab.cli.checkpoints import reconcile_data

    saved = {"root": "/old", "batch_size": 8, "shuffle_seed": 0, "_class_path": "x"}
    assert reconcile_data(saved, {**saved, "root": "/new", "_class_path": "y"}) == [
        'data.init_args.root="/new" (checkpoint "/old")'
    ]
    with pytest.raises(ValueError, match="data.init_args.shuffle_seed: checkpoint 0, given 1"):
        reconcile_data(saved, {**saved, "shuffle_seed": 1})


def test_a_checkpoint_of_another_task(shapes_root, trained, tmp_path, capsys) -> None:
    args = ["validate", *ade_args(tmp_path, tmp_path)[1:], f"--ckpt_path={trained}"]
    fails(
        capsys,
        args,
        "holds a splitlab.tasks.ClassificationTask, the config builds a splitlab.tasks.SegmentationTask",
    )


@pytest.mark.parametrize(
    ("below", "why"), [("", "File exists"), ("runs/logs", "Not a directory")], ids=["the-folder", "a-parent"]
)
def test_an_unwritable_log_folder(shapes_root, tmp_path, capsys, below, why) -> None:
    """A file where the run folder (or one of its parents) goes: the message names that file."""
    (tmp_path / "blocked").write_text("a file where the run folder should be")
    fails(
        capsys,
        fit_args(shapes_root, tmp_path / "blocked" / below),
        f"{tmp_path / 'blocked'}: a file stands where the run needs a folder ({why})",
    )


def test_a_checkpoint_that_cannot_be_written_stops_the_run(
    shapes_root, tmp_path, capsys, monkeypatch
) -> None:
    import lightning.fabric.plugins.io.torch_io as torch_io

    from splitlab.callbacks import VerifiedCheckpointIO

    monkeypatch.setattr(
        torch_io, "_atomic_save", lambda checkpoint, path: None
    )  # Lightning swallowed the error
    monkeypatch.setattr(
        VerifiedCheckpointIO,
        "__init__",
        lambda self, retries=1, wait=0.0: (
            setattr(self, "retries", retries),
            setattr(self, "wait", wait),
            None,
        )[-1],
    )
    err = fails(
        capsys, fit_args(shapes_root, tmp_path), "could not be written (nothing was written)", "checkpoints"
    )
    assert "the run stops so that no work is lost silently" in err


def test_an_unwritable_picture_folder_is_a_warning(shapes_root, tmp_path) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "token_maps").write_text("a file where the pictures should go")
    with pytest.warns(UserWarning, match="token map not written"):
        main(fit_args(shapes_root, tmp_path))
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def stopped_at(
    epoch: int, batch: int, rl_epochs: int, signal_name: str = "SIGTERM"
) -> tuple[dict, dict, dict]:
    """Callbacks of a run that a signal stops at ``batch`` of ``epoch``: schedule, checkpoint, signal."""
    schedule = {
        "class_path": "splitlab.callbacks.SplitSchedule",
        "init_args": {"warm_start_epochs": 1, "rl_epochs": rl_epochs},
    }
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"save_last": True},
    }
    stop = {
        "class_path": "tests.helpers.SignalAt",
        "init_args": {"epoch": epoch, "batch": batch, "signal_name": signal_name},
    }
    return schedule, checkpoint, stop


def test_sigterm_leaves_a_checkpoint_and_last_resumes_the_unversioned_run(
    shapes_root, tmp_path, capsys
) -> None:
    schedule, checkpoint, stop = stopped_at(epoch=1, batch=1, rl_epochs=2)
    unversioned = [
        "--trainer.logger.init_args.name=run",
        "--trainer.logger.init_args.version=null",
    ]  # as the recipes
    args = tiny_args(shapes_root, tmp_path, *unversioned, "--trainer.max_epochs=3")
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *args, f"--trainer.callbacks={json.dumps([schedule, checkpoint, stop])}"])
    assert exit_.value.code == 128 + 15
    run = tmp_path / "run" / "version_0"
    assert (run / "checkpoints" / "interrupted.ckpt").is_file()
    # the stop neither validated the half epoch nor saved it as a finished one
    assert not list((run / "checkpoints").glob("epoch=1-*.ckpt"))
    before = list(csv.DictReader((run / "metrics.csv").open()))
    assert not [
        r for r in before if r.get("epoch") == "1" and any(k.startswith("val") and v for k, v in r.items())
    ]
    main(["fit", *args, f"--trainer.callbacks={json.dumps([schedule, checkpoint])}", "--ckpt_path=last"])
    assert not (tmp_path / "run" / "version_1").exists()  # the same run continued
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    epochs = {int(r["epoch"]) for r in rows if r.get("epoch")}
    assert epochs == {0, 1, 2}
    # the history before the stop survived as it was, and epoch 0 was not trained again
    assert all(all(r.get(k, "") == v for k, v in b.items()) for r, b in zip(rows, before, strict=False))
    epoch0 = [r for r in rows if r.get("epoch") == "0"]
    assert before and len(epoch0) == len([b for b in before if b.get("epoch") == "0"])
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["epoch"] == 2 and state["splitlab"]["stage"] == "ppo"


STAGES_FIRST = {"dense": (0, 1, 1), "warm_start": (1, 1, 0), "ppo": (0, 2, 0)}  # warm, rl, dense epochs


def metric_rows(run: Path) -> list[dict[str, str]]:
    """``metrics.csv`` without the wall-clock columns (the same run takes another time)."""
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize("stage", sorted(STAGES_FIRST))
def test_a_stop_inside_the_first_epoch_resumes_into_the_uninterrupted_run(
    shapes_root, tmp_path, stage
) -> None:
    """A stop in epoch 0 (of a fit that starts in each stage) leaves one checkpoint to resume from: no
    ``last.ckpt`` written after it marks the epoch finished (Lightning writes one at the end of training
    when it believes none was saved), so ``--ckpt_path last`` resumes at the next batch, and every
    metric row and the summary are the uninterrupted run's."""
    warm, rl, dense = STAGES_FIRST[stage]
    stop = {
        "class_path": "tests.helpers.SignalAt",
        "init_args": {"epoch": 0, "batch": 1, "signal_name": "SIGTERM"},
    }
    main(["fit", *tiny_args(shapes_root, tmp_path / "full", *schedule_args(warm, rl, dense))])
    args = tiny_args(shapes_root, tmp_path / "stopped")
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *args, *schedule_args(warm, rl, dense, also=[stop])])
    assert exit_.value.code == 128 + 15
    checkpoints = tmp_path / "stopped" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["interrupted.ckpt"]
    state = torch.load(checkpoints / "interrupted.ckpt", weights_only=False)
    assert state["epoch"] == 0 and state["splitlab"]["stage"] == stage
    main(["fit", *args, *schedule_args(warm, rl, dense), "--ckpt_path=last"])
    assert metric_rows(tmp_path / "stopped") == metric_rows(tmp_path / "full")
    full, resumed = (json.loads((tmp_path / r / "summary.json").read_text()) for r in ("full", "stopped"))
    assert full["policies"].keys() == resumed["policies"].keys()
    for policy, row in full["policies"].items():
        for key in ("metric", "token_fraction_mean", "token_fraction_std"):
            assert resumed["policies"][policy][key] == pytest.approx(row[key], abs=1e-6), (policy, key)
    assert resumed["lambda"] == pytest.approx(full["lambda"], abs=1e-6)


@pytest.mark.parametrize(("signal_name", "code"), [("SIGTERM", 15), ("SIGINT", 2)])
def test_a_stop_after_an_epochs_last_batch_still_validates_and_saves_that_epoch(
    shapes_root, tmp_path, signal_name, code
) -> None:
    """The epoch is complete (a resume starts the next one): skipping its validation and checkpoint
    would leave them missing for good. Ctrl-C (SIGINT) stops as SIGTERM does."""
    schedule, checkpoint, stop = stopped_at(epoch=0, batch=2, rl_epochs=1, signal_name=signal_name)
    args = tiny_args(shapes_root, tmp_path, f"--trainer.callbacks={json.dumps([schedule, checkpoint, stop])}")
    with pytest.raises(SystemExit) as exit_:  # 24 images in batches of 8: batch 2 is epoch 0's last
        main(["fit", *args])
    assert exit_.value.code == 128 + code and (tmp_path / "checkpoints" / "interrupted.ckpt").is_file()
    assert list((tmp_path / "checkpoints").glob("epoch=0-*.ckpt"))
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert any(r.get("epoch") == "0" and r.get("val/fraction") for r in rows)
    assert not any(r.get("epoch") == "1" for r in rows)


def test_resuming_an_earlier_checkpoint_logs_the_lost_epoch_once(shapes_root, tmp_path) -> None:
    """Resumed from an earlier epoch's checkpoint (as after a crash), ``metrics.csv`` keeps the rows up
    to it and the resumed epoch's rows once (Lightning logs by batches, not by optimizer steps, which
    PPO takes several of per batch); ``--ckpt_path last`` finds the unversioned run's checkpoints."""

    def per_epoch() -> dict[str, int]:
        rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
        return {e: sum(r.get("epoch") == e for r in rows) for e in ("0", "1")}

    main(fit_args(shapes_root, tmp_path))  # a warm-start epoch, then a PPO epoch
    first = per_epoch()
    epoch0 = next((tmp_path / "checkpoints").glob("epoch=0-*.ckpt"))
    main([*fit_args(shapes_root, tmp_path), f"--ckpt_path={epoch0}"])
    assert per_epoch() == first and first["1"] > 0
    main([*fit_args(shapes_root, tmp_path), "--ckpt_path=last"])  # found, and finished: nothing to train
    assert per_epoch() == first


# ------------------------------------------------------------------------------------- commands
COMMANDS = [
    (["bench", "--batch-size", "0"], "argument --batch-size: 0 is not a positive integer"),
    (["bench", "--batch-size", "-1"], "argument --batch-size: -1 is not a positive integer"),
    (["bench", "--iters", "0"], "argument --iters: 0 is not a positive integer"),
    (["bench", "--budget", "0"], "argument --budget: 0 is not a token fraction in (0, 1]"),
    (["bench", "--device", "cuda"], "--device cuda: CUDA is not available"),
    (["bench", "--device", "gpu0"], "argument --device: 'gpu0' is not a torch device"),
    (
        ["bench", "--json", "/proc/version/out.json"],
        "argument --json: '/proc/version/out.json': /proc/version is a file",
    ),
    (["bench", "--ckpt", "/no/such.ckpt"], "--ckpt='/no/such.ckpt': no such checkpoint file"),
    (
        ["bench", "--model", "test_vit", "--img-size", "64", "--images", "/no/such/folder"],
        "--images /no/such/folder",
    ),
    (["curve", "/no/such/run"], "RUN_DIR/config.yaml: /no/such/run/config.yaml not found"),
    (["curve", ".", "--eval-budgets", ""], "give at least one fraction"),
    (
        ["data", "shapes", "--out", "x", "--img-size", "-4"],
        "argument --img-size: -4 is not a positive integer",
    ),
    (["data", "shapes", "--out", "x", "--img-size", "16"], "img_size=16: use at least 32 px"),
    (["data", "coco", "--out", "x", "--img-size", "8"], "img_size=8: use at least 32 px"),
    (["data", "ade20k", "--out", "x", "--seed", "-1"], "argument --seed: -1 is not a seed in [0, 2**32)"),
    (["demo", "--seed", "4294967296"], "argument --seed: 4294967296 is not a seed"),
]


@pytest.mark.parametrize(("argv", "message"), COMMANDS, ids=[" ".join(a[:3]) for a, _ in COMMANDS])
def test_command_arguments_are_checked(capsys, argv, message) -> None:
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    fails(capsys, argv, message)
