"""`MultiTaskSplit`: one backbone, tokenizer and policy for the COCO and ADE20K twins' heads, each task
with its own data, trained in the stages of every task (a tiny run; the twins' own: tests/pipelines)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from splitlab.cli import lightning_main
from splitlab.data import generate_ade20k, generate_coco
from splitlab.model import SplitMultiTask, load
from splitlab.tasks import MultiTaskSplit, SplitTask, load_task
from splitlab.tasks.multitask import TASK_CLASSES
from splitlab.tasks.state import SamplingStream
from splitlab.training import LossInputs
from tests.helpers import schedule_args, twin_configs

SIZE = 64


def tiny_tasks() -> dict:
    return {
        "coco": {
            "task": "detection",
            "num_classes": 3,
            "detector": {
                "name": "faster_rcnn",
                "anchor_sizes": [16, 32, 64, 128],
                "representation_size": 32,
                "torchvision_kwargs": {"rpn_batch_size_per_image": 32, "box_batch_size_per_image": 32},
            },
            "pyramid_channels": 16,
            "pyramid_indices": [1],
        },
        "ade20k": {
            "task": "segmentation",
            "num_classes": 5,
            "background_classes": [0, 1],
            "pyramid_channels": 16,
            "pyramid_indices": [1],
            "decode_head": {"channels": 16},
            "auxiliary_head": None,
        },
    }


def tiny_data(root) -> dict:
    common = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "batch_size": 4, "num_workers": 0}
    return {
        "coco": {
            "class_path": "splitlab.data.CocoDetectionData",
            "init_args": {"root": str(root / "coco"), "masks": False, **common},
        },
        "ade20k": {
            "class_path": "splitlab.data.ADE20KData",
            "init_args": {"root": str(root / "ade20k"), "scale_range": [1.0, 1.0], **common},
        },
    }


def tiny_args(root, log_dir, *extra: str) -> list[str]:
    return [
        *twin_configs("coco+ade20k"),
        f"--data.init_args.task_data={json.dumps(tiny_data(root))}",
        f"--model.init_args.tasks={json.dumps(tiny_tasks())}",
        f"--model.init_args.backbone_kwargs={json.dumps({'img_size': SIZE, 'patch_size': 8, 'embed_dim': 32, 'depth': 2, 'num_heads': 2})}",
        "--model.init_args.tokenizer.decision_dim=16",
        "--model.init_args.tokenizer.decision_heads=2",
        "--model.init_args.warm_start.imitation_steps=1",
        "--model.init_args.ppo.samples=2",
        "--model.init_args.ppo.epochs=2",
        "--model.init_args.evaluation.calibration_images=16",
        f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.logger.init_args.name=",
        "--trainer.logger.init_args.version=",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("multitask")
    generate_coco(root / "coco", img_size=SIZE, train=12, val=8, seed=0)
    generate_ade20k(root / "ade20k", img_size=SIZE, train=12, val=8, seed=1)
    return root


@pytest.fixture(scope="module")
def run(data_root, tmp_path_factory):
    """Dense, warm start and PPO, one epoch each, in process."""
    out = tmp_path_factory.mktemp("multitask-run")
    cli = lightning_main(["fit", *tiny_args(data_root, out, *schedule_args(1, 1, dense=1))])
    return out, cli


def test_one_run_trains_and_reports_both_tasks(run) -> None:
    out, cli = run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "multitask" and summary["metric"] == "mean"
    assert summary["trained_policy"] == "multitask" and summary["columns"] == ["coco/map", "ade20k/miou"]
    learned = summary["policies"]["multitask"]
    assert learned["metric"] == pytest.approx((learned["coco/map"] + learned["ade20k/miou"]) / 2)
    assert set(summary["policies"]) == {"multitask", "uniform", "random", "entropy", "oracle"}
    assert summary["policies"]["uniform"]["token_fraction_mean"] == 1.0
    # the deployed cut was fitted on both tasks' images (16 validation images: sampling noise)
    assert learned["token_fraction_mean"] == pytest.approx(0.5, abs=0.12)
    task = cli.model
    assert task.stage == "ppo" and bool((task.loss_scale.value > 0).all())  # both tasks' running losses


def test_the_trained_model_loads_and_predicts_both_tasks_as_validate_scores(run, data_root) -> None:
    out, cli = run
    model = load(out)
    assert isinstance(model, SplitMultiTask) and set(model.members) == {"coco", "ade20k"}
    assert model.members["coco"].names and model.members["ade20k"].config["head"]["num_classes"] == 5
    files = sorted((data_root / "ade20k" / "images" / "validation").iterdir())[:3]
    results = model.predict(files)
    assert len(results) == 3 and all({"coco", "ade20k"} <= set(r) for r in results)
    # the loaded model's layouts are the task's deployed ones
    images = torch.stack([model.preprocessing(Image.open(f))[0] for f in files])
    with torch.no_grad():
        _, mine = model(images)
        _, theirs = cli.model.model.eval()(images)
    assert torch.equal(mine.fraction, theirs.fraction)


def test_splitlab_predict_writes_each_tasks_results(run, data_root, tmp_path) -> None:
    from splitlab.commands import run as command

    out, _ = run
    images = data_root / "ade20k" / "images" / "validation"
    assert command(["predict", str(out), str(images), "--out", str(tmp_path / "p")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["ade20k"]["mask"].startswith("masks/ade20k/") for r in rows)
    assert len(list((tmp_path / "p" / "masks" / "ade20k").glob("*.png"))) == 8
    detections = json.loads((tmp_path / "p" / "coco_results_coco.json").read_text())
    assert sum(len(r["coco"]["boxes"]) for r in rows) == len(detections)


def test_validate_from_the_checkpoint_scores_as_the_fit_did(run, data_root, tmp_path) -> None:
    out, _ = run
    lightning_main(
        ["validate", *tiny_args(data_root, tmp_path), f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"]
    )
    before = json.loads((out / "summary.json").read_text())["policies"]["multitask"]
    again = json.loads((tmp_path / "summary.json").read_text())["policies"]["multitask"]
    for key in ("metric", "coco/map", "ade20k/miou", "token_fraction_mean"):
        assert again[key] == pytest.approx(before[key], abs=1e-6), key


def test_per_image_losses_are_each_images_own_task_loss_over_its_scale(run, data_root) -> None:
    """The reward contract: an image's loss depends on it alone, and is its task's loss scaled."""
    _, cli = run
    task = cli.model.eval()
    loaders = {name: data.val_dataloader() for name, data in cli.datamodule.tasks.items()}
    batch = {name: next(iter(loader)) for name, loader in loaders.items()}
    images, targets = task.unpack_batch(batch)
    with torch.no_grad():
        layout = task.model.layout(images, policy="uniform")
        losses = task.per_image_loss(task.forward_layout(layout), targets)
        positions, seg_targets = targets.parts["ade20k"]
        only = task.unpack_batch({"ade20k": batch["ade20k"]})
        alone = task.per_image_loss(
            task.forward_layout(task.model.layout(only[0], policy="uniform")), only[1]
        )
    assert losses.shape == (images.shape[0],)
    torch.testing.assert_close(losses[positions], alone)
    own = task.task_logic["ade20k"].per_image_loss(
        task.model.forward_layout(layout, {"ade20k": positions})["ade20k"],
        seg_targets,
        LossInputs(task.generator),
    )
    torch.testing.assert_close(losses[positions], own / task.loss_scale.value[1])


def single_task_twin(multi: MultiTaskSplit, name: str) -> SplitTask:
    """The single-task run of ``multi``'s task ``name``: the run's shared settings and the task's own,
    with the multi-task model's backbone, tokenizer and that task's head (the same weights)."""
    given = dict(multi.hparams.tasks[name])
    task_class = TASK_CLASSES[given.pop("task")]
    shared = {k: v for k, v in multi.hparams.items() if k not in ("tasks", "loss_momentum")}
    single = task_class(**shared, **given)
    single.model.backbone.load_state_dict(multi.model.backbone.state_dict())
    single.model.tokenizer.load_state_dict(multi.model.tokenizer.state_dict())
    single.model.head.load_state_dict(multi.model.members[name].head.state_dict())
    single.algorithm.progress.enter(multi.stage)  # PPO's: detection's RoI loss on the reference proposals
    single.sync_deployed()
    return single.eval()


def test_each_tasks_loss_and_metrics_are_its_single_task_runs(run, data_root) -> None:
    """Each task of a multi-task run computes, on the same batch and weights, the per-image losses
    (unscaled) and metrics its own single-task run does: one task code, held by name."""
    out, cli = run
    multi = load_task(out / "checkpoints" / "last.ckpt").eval()
    batch = {name: next(iter(data.val_dataloader())) for name, data in cli.datamodule.tasks.items()}
    images, targets = multi.unpack_batch(batch)
    multi.sampling = SamplingStream(5)  # detection's heads draw their samplers' seeds from it
    with torch.no_grad():
        outputs, layout = multi(images)
        losses = multi.per_image_loss(outputs, targets)
        metrics = multi.build_metrics()
        multi.update_metrics(metrics, outputs, targets, layout)
    computed = metrics.compute()
    for k, name in enumerate(multi.task_logic):
        single = single_task_twin(multi, name)
        single.sampling = SamplingStream(5)
        positions, _ = targets.parts[name]
        own_images, own_targets = single.unpack_batch(batch[name])
        with torch.no_grad():
            own_outputs, own_layout = single(own_images)
            own_losses = single.per_image_loss(own_outputs, own_targets)
            own_metrics = single.build_metrics()
            single.update_metrics(own_metrics, own_outputs, own_targets, own_layout)
        assert torch.equal(own_layout.fraction, layout.fraction[positions])
        torch.testing.assert_close(losses[positions] * multi.loss_scale.value[k], own_losses)
        own = {key: v for key, v in own_metrics.compute().items() if v.numel() == 1}
        assert own and own.keys() == {key.split("/", 1)[1] for key in computed if key.startswith(f"{name}/")}
        for key, value in own.items():
            torch.testing.assert_close(computed[f"{name}/{key}"], value, equal_nan=True, msg=key)


def test_data_of_other_tasks_is_refused_in_one_line(data_root, tmp_path) -> None:
    data = tiny_data(data_root)
    data.pop("ade20k")
    with pytest.raises(ValueError, match=r"needs data of each by the same names"):
        lightning_main(
            ["fit", *tiny_args(data_root, tmp_path, f"--data.init_args.task_data={json.dumps(data)}")]
        )
