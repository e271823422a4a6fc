"""The dense recipes' CI twins end to end: `lightning fit --config tasks/<task>.yaml --config configs/ci/<task>.yaml`
after a dense backbone stage, then `validate` and `test` from the checkpoint, on generated data."""

from __future__ import annotations

import json

import pytest

from splitlab.cli import lightning_main
from splitlab.commands.demo import run_pipeline
from tests.helpers import one_point_curve, twin_configs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("dense")
    return {
        task: (root / task, run_pipeline(root / task, seed=0, quiet=True, task=task))
        for task in ("ade20k", "coco")
    }


def _row(record: dict, policy: str) -> dict:
    return record["policies"][policy]


@pytest.mark.parametrize(("task", "metric"), [("ade20k", "miou"), ("coco", "map")])
def test_fit_writes_a_summary(runs, task, metric) -> None:
    _, record = runs[task]
    assert record["metric"] == metric and record["stage"] == "fit" and record["lambda"] >= 0
    assert set(record["policies"]) == {"learned", "uniform", "random", "entropy"}
    learned = _row(record, "learned")
    assert abs(learned["token_fraction_mean"] - record["target_fraction"]) <= 0.03
    for baseline in ("random", "entropy"):  # compared at the learned layout's fraction
        assert abs(_row(record, baseline)["token_fraction_mean"] - learned["token_fraction_mean"]) <= 0.03
    uniform = _row(record, "uniform")
    assert uniform["token_fraction_mean"] == 1.0
    assert uniform["metric"] > {"miou": 0.6, "map": 0.5}[metric]  # the dense stage trained a working backbone
    assert learned["images_per_second"] > 0


@pytest.mark.parametrize("task", ["ade20k", "coco"])
@pytest.mark.parametrize("command", ["validate", "test"])
def test_validate_and_test_from_the_checkpoint(runs, task, command, tmp_path) -> None:
    out, record = runs[task]
    args = [
        *twin_configs(task),
        f"--data.init_args.root={out / 'data'}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    args += [
        "--trainer.logger.init_args.name=",
        "--trainer.logger.init_args.version=",
        "--trainer.enable_progress_bar=false",
    ]
    lightning_main([command, *args, f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"])
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["stage"] == command and again["lambda"] == pytest.approx(record["lambda"])
    assert _row(again, "learned")["metric"] == pytest.approx(_row(record, "learned")["metric"], abs=1e-6)


def test_a_detection_run_predicts_its_files_as_validate_scores_them(runs) -> None:
    """`splitlab.load` + `predict` on the validation files (boxes in each file's own pixels), scored
    against the annotations file as COCO evaluation reads it: validate's mAP and token fraction."""
    import torch

    import splitlab
    from splitlab.metrics import detection_metrics

    out, record = runs["coco"]
    doc = json.loads((out / "data" / "annotations" / "instances_val2017.json").read_text())
    labels = {cid: i + 1 for i, cid in enumerate(sorted(c["id"] for c in doc["categories"]))}
    model = splitlab.load(out)
    results = model.predict(
        [out / "data" / "val2017" / im["file_name"] for im in doc["images"]], batch_size=16
    )
    metric = detection_metrics()["map"]
    for image, result in zip(doc["images"], results, strict=True):
        anns = [a for a in doc["annotations"] if a["image_id"] == image["id"]]
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)]).reshape(
            -1, 4
        )
        truth = {
            "boxes": boxes.clamp(min=0).minimum(torch.tensor([image["width"], image["height"]] * 2)),
            "labels": torch.tensor([labels[a["category_id"]] for a in anns], dtype=torch.long),
            "iscrowd": torch.tensor([a.get("iscrowd", 0) for a in anns], dtype=torch.long),
            "area": torch.tensor([float(a["area"]) for a in anns]),
        }
        found = {
            "boxes": torch.tensor(result["boxes"]).reshape(-1, 4),
            "scores": torch.tensor(result["scores"]),
            "labels": torch.tensor(result["labels"], dtype=torch.long),
        }
        metric.update([found], [truth])
    learned = _row(record, "learned")
    fraction = sum(r["token_fraction"] for r in results) / len(results)
    assert float(metric.compute()["map"]) == pytest.approx(learned["metric"], abs=1e-4)
    assert fraction == pytest.approx(learned["token_fraction_mean"], abs=1e-6)
    assert {r["category_ids"][0] for r in results if r["labels"]} <= {c["id"] for c in doc["categories"]}


@pytest.mark.parametrize("task", ["ade20k", "coco"])
def test_curve_of_a_dense_run(runs, task, tmp_path) -> None:
    """`splitlab curve` on a detection and a segmentation run (trained for one budget: its one point)."""
    out, record = runs[task]
    one_point_curve(out, tmp_path / "curve", record, tolerance=1e-6)


def test_segmentation_regression(runs, measured) -> None:
    _, record = runs["ade20k"]
    learned, random, entropy = (_row(record, p) for p in ("learned", "random", "entropy"))
    measured(  # the numbers belong in the CI log
        f"ade20k CI: learned mIoU {learned['miou']:.3f} at fraction {learned['token_fraction_mean']:.3f}, "
        f"object fine coverage {learned['object_fine_coverage']:.3f} (boundary {learned['boundary_fine_coverage']:.3f}); "
        f"entropy coverage {entropy['object_fine_coverage']:.3f} at {entropy['token_fraction_mean']:.3f}; "
        f"random mIoU {random['miou']:.3f} at {random['token_fraction_mean']:.3f}"
    )
    assert learned["object_fine_coverage"] >= entropy["object_fine_coverage"] + 0.10
    assert learned["miou"] >= random["miou"]


def check_detection(record: dict, seed: int, measured) -> None:
    """The detection twin tells policies apart (docs/detection.md): the uniform grid detects well, and
    at half the tokens the learned layout beats random by 0.10 mAP and entropy, with fine tokens on
    at least 70% of the object cells."""
    learned, uniform, random, entropy = (_row(record, p) for p in ("learned", "uniform", "random", "entropy"))
    measured(  # the numbers belong in the CI log
        f"coco seed {seed}: learned mAP {learned['map']:.3f} at fraction {learned['token_fraction_mean']:.3f} "
        f"(object fine coverage {learned['object_fine_coverage']:.3f}), uniform {uniform['map']:.3f}, "
        f"random {random['map']:.3f} ({random['object_fine_coverage']:.3f}), entropy {entropy['map']:.3f}"
    )
    assert abs(learned["token_fraction_mean"] - record["target_fraction"]) <= 0.03
    assert uniform["map"] >= 0.5, f"the dense stage left the uniform grid at mAP {uniform['map']:.3f}"
    assert learned["map"] >= random["map"] + 0.10, f"learned {learned['map']:.3f}, random {random['map']:.3f}"
    assert learned["map"] >= entropy["map"]
    assert learned["object_fine_coverage"] >= 0.7


def test_detection_regression(runs, measured) -> None:
    check_detection(runs["coco"][1], 0, measured)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="a measured miss (docs/detection.md): trained at 0.7 the policy keeps 0.83-0.88 of uniform mAP, "
    "below the 0.9 asked; the same twin's policy trained at 0.5 ranks well enough for 0.92 at 0.7",
)
def test_detection_at_a_larger_budget_keeps_nine_tenths_of_uniform(tmp_path, measured) -> None:
    record = run_pipeline(
        tmp_path / "coco", seed=0, quiet=True, task="coco", extra=["--model.init_args.target_fraction=0.7"]
    )
    learned, uniform = _row(record, "learned"), _row(record, "uniform")
    measured(
        f"coco @0.7: learned mAP {learned['map']:.3f} at {learned['token_fraction_mean']:.3f}, uniform {uniform['map']:.3f}"
    )
    assert abs(learned["token_fraction_mean"] - 0.7) <= 0.03
    assert learned["map"] >= 0.9 * uniform["map"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["ade20k", "coco"])
@pytest.mark.parametrize("seed", [1, 2])
def test_dense_twins_meet_the_budget_across_seeds(tmp_path, task, seed, measured) -> None:
    record = run_pipeline(tmp_path / task, seed=seed, quiet=True, task=task)
    learned = _row(record, "learned")
    measured(  # the numbers belong in the CI log
        f"{task} seed {seed}: learned {learned['metric']:.3f} at fraction {learned['token_fraction_mean']:.3f}"
    )
    assert abs(learned["token_fraction_mean"] - record["target_fraction"]) <= 0.03
    if task == "coco":
        check_detection(record, seed, measured)
