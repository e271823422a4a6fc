"""`splitlab bench --task detection|segmentation`: the whole dense model against the same model on timm's
uniform grid (the same computation where every patch is finest), its parts, the Amdahl ideal, and
clear refusals (no timing asserted)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pycocotools import mask as coco_mask

from splitlab.commands import run
from splitlab.commands.bench_dense import (
    PARTS,
    amdahl,
    network_placements,
    recipe_model,
    remapped_indices,
    task_recipe,
)
from splitlab.model.preprocess import Placement
from splitlab.model.tasks import instance_masks

TINY = {"backbone": "test_vit", "img_size": 64}  # timm's 6-block test ViT, a 4 x 4 grid of /16 patches


@pytest.fixture(scope="module")
def models() -> dict:
    torch.manual_seed(0)
    return {task: recipe_model([task_recipe(task)], **TINY).eval() for task in ("detection", "segmentation")}


def test_the_recipes_heads_on_a_smaller_backbone(models) -> None:
    detector, segmenter = models["detection"], models["segmentation"]
    assert detector.head.detector.roi_heads.has_mask()  # tasks/coco.yaml: Mask R-CNN
    assert detector.backbone_indices() == [5]  # [23] of 24 blocks: the last of 6
    assert segmenter.backbone_indices() == [1, 2, 3, 5]  # [7, 11, 15, 23] at the same depths
    assert detector.levels.sizes == segmenter.levels.sizes == (64, 32, 16)
    assert detector.budget == segmenter.budget == 0.7


def test_remapped_pyramid_blocks() -> None:
    assert remapped_indices([23], 24, 12) == [11]
    assert remapped_indices([7, 11, 15, 23], 24, 12) == [3, 5, 7, 11]
    with pytest.raises(ValueError, match="do not map to distinct blocks"):
        remapped_indices([7, 11, 15, 23], 24, 2)


@pytest.mark.parametrize("task", ["detection", "segmentation"])
def test_every_patch_finest_computes_what_the_uniform_model_does(models, task) -> None:
    """The bench's two paths differ by the layout alone: at the finest level everywhere SPLIT's
    packed path gives the uniform model's outputs, after NMS and paste too."""
    model = models[task]
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    places = network_placements(images)
    with torch.inference_mode():
        packed, layout = model(images, policy="uniform")
        uniform = model.forward_uniform(images)
        assert layout.fraction.min() == 1.0
        if task == "segmentation":
            torch.testing.assert_close(packed["logits"], uniform["logits"], atol=1e-4, rtol=1e-4)
        else:
            for key in packed["features"]:
                torch.testing.assert_close(
                    packed["features"][key], uniform["features"][key], atol=1e-4, rtol=1e-4
                )
        split_results, uniform_results = model.results(packed, places), model.results(uniform, places)
    for a, b in zip(split_results, uniform_results, strict=True):
        if task == "segmentation":
            assert torch.equal(a["mask"], b["mask"])
        else:
            assert len(a["boxes"]) == len(b["boxes"]) >= 20  # primed: the head runs on detections
            np.testing.assert_allclose(a["boxes"], b["boxes"], atol=1e-3)
            assert a["labels"] == b["labels"] and a["segmentations"] == b["segmentations"]


def test_pasted_masks_land_in_the_input_images_pixels() -> None:
    """A full box mask pasted through a letterbox (an input of 200 x 100 at half scale in a 128 net,
    padded 14 px on top) covers the box in the input's own pixels, as COCO's RLE."""
    place = Placement(width=200, height=100, scale=0.5, left=14, top=14, resized=(50, 100))
    boxes = torch.tensor([[24.0, 24.0, 64.0, 44.0]])  # network pixels: input (20, 20)-(100, 60)
    [rle] = instance_masks(torch.ones(1, 1, 28, 28), boxes, place, (128, 128))
    decoded = coco_mask.decode({"size": rle["size"], "counts": rle["counts"].encode()})
    assert decoded.shape == (100, 200)
    rows, cols = np.nonzero(decoded)
    assert abs(rows.min() - 20) <= 2 and abs(rows.max() - 59) <= 2
    assert abs(cols.min() - 20) <= 2 and abs(cols.max() - 99) <= 2
    assert instance_masks(torch.ones(0, 1, 28, 28), boxes[:0], place, (128, 128)) == []


def test_amdahl_ideal_worked_by_hand() -> None:
    """Uniform 100 ms: backbone 60, the rest 40; SPLIT's tokenizer 5 + backbone 35 = 40 -> the backbone
    1.5x, the ideal 100 / (40 + 60 / 1.5) = 1.25x."""
    uniform = dict.fromkeys(PARTS, 0.0) | {"backbone": 0.060, "pyramid": 0.010, "head": 0.025, "post": 0.005}
    split = dict(uniform) | {"tokenizer": 0.005, "backbone": 0.035}
    ideal = amdahl(uniform, split)
    assert ideal["backbone_speedup"] == pytest.approx(1.5)
    assert ideal["backbone_share_uniform"] == pytest.approx(0.6)
    assert ideal["amdahl_ideal"] == pytest.approx(1.25)


@pytest.mark.parametrize("task", ["detection", "segmentation"])
def test_the_dense_bench_command(task, tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--task", task, "--model", "test_vit", "--img-size", "64", "--batch-size", "1"]
    assert run([*args, "--warmup", "0", "--iters", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Amdahl ideal" in printed and "SPLIT achieves" in printed
    record = json.loads(out.read_text())
    dense = record["dense"]
    assert record["config"]["img_size"] == [64, 64] and record["config"]["budget"] == 0.7
    assert dense["task"] == task and dense["token_fraction"] == pytest.approx(0.7, abs=0.2)
    assert set(dense["parts_ms_per_image_split"]) == set(PARTS) == set(dense["parts_ms_per_image_uniform"])
    assert dense["parts_ms_per_image_uniform"]["tokenizer"] < dense["parts_ms_per_image_split"]["tokenizer"]
    assert dense["share_of_amdahl_ideal"] == pytest.approx(dense["speedup"] / dense["amdahl_ideal"])
    for line in PARTS:
        assert any(row.startswith(line) for row in printed.splitlines()), line
    counted = dense["detections_per_image_uniform"], dense["detections_per_image_split"]
    assert (min(counted) > 0) if task == "detection" else counted == (None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "tasks/imagenet.yaml"], "is not a detection or segmentation task"),
        (["--config", "nowhere.yaml"], "--config nowhere.yaml: no such file"),
        (["--task", "detection", "--lm", "gpt2"], "--lm: not for a detector or segmenter"),
        (["--task", "detection", "--train"], "--train times a fresh timm classifier"),
    ],
)
def test_dense_bench_refusals(args, message) -> None:
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        run(["bench", *args, "--model", "test_vit", "--img-size", "64"])


def test_a_dense_checkpoint_is_benched_whole_as_it_was_saved(models, tmp_path) -> None:
    """`splitlab bench --ckpt` of a segmenter: the whole model, its policy as saved (no calibration
    here unless --budget asks), and what it holds said."""
    from splitlab.commands.bench import BenchConfig, run_bench

    models["segmentation"].save_pretrained(tmp_path / "segmenter")
    cfg = BenchConfig(ckpt=str(tmp_path / "segmenter"), budget=None, batch_size=1, warmup=0, iters=1)
    record = run_bench(cfg)
    assert record["dense"]["task"] == "segmentation" and record["policy_cut"] is None
    assert record["holds"] == "policy learned, cuts never calibrated"
    calibrated = run_bench(
        BenchConfig(ckpt=str(tmp_path / "segmenter"), budget=0.7, batch_size=2, warmup=0, iters=1)
    )
    assert calibrated["policy_cut"] is not None and calibrated["dense"]["token_fraction"] == pytest.approx(
        0.7, abs=0.2
    )
