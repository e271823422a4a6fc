"""The generators' hard scenes (``difficulty="hard"``, issue 49): what makes them hard holds, their
files load through the project's own data modules, and the default scenes are those of before."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from splitlab.data.generators.dense_scenes import render_hard_scene, render_scene
from splitlab.data.generators.hard_scenes import HARD_THINGS, OUTLINED, THIN, natural_texture
from splitlab.data.generators.shapes import CLASSES, render

CELL = 8  # the twins' finest patch (levels 32/16/8)
IMG = 128


def erode(mask: np.ndarray, side: int) -> np.ndarray:
    """Binary erosion by a ``side`` x ``side`` square (``side`` odd; outside the image is not the mask):
    what is left where a square that size fits."""
    outside = F.pad(torch.from_numpy(~mask).float()[None, None], (side // 2,) * 4, value=1.0)
    return ~(F.max_pool2d(outside, side, stride=1)[0, 0] > 0).numpy()


@pytest.fixture(scope="module")
def scenes() -> list[tuple[np.ndarray, np.ndarray, list[dict]]]:
    rng = np.random.default_rng(0)
    return [render_hard_scene(rng, IMG, CELL) for _ in range(40)]


def test_default_scenes_are_those_of_before() -> None:
    """The default generators draw what they drew before the hard scenes came (hashes taken from the
    generators of main 8b5bacd): the default twins' data is unchanged for a seed."""
    h = hashlib.sha256()
    rng = np.random.default_rng(0)
    for _ in range(4):
        img, labels, instances = render_scene(rng, 128)
        h.update(img.tobytes())
        h.update(labels.astype(np.int64).tobytes())
        for inst in instances:
            h.update(bytes([inst["category"]]))
            h.update(np.packbits(inst["mask"]).tobytes())
    assert h.hexdigest() == "5bfc4a4b0acd58017b43dea647a9f356e51cf1b7b339417447b6876eb895b388"
    h, rng = hashlib.sha256(), np.random.default_rng(0)
    for kind in CLASSES:
        img, box = render(kind, rng, 64, (12, 20))
        h.update(img.tobytes())
        h.update(np.array(box, np.int64).tobytes())
    assert h.hexdigest() == "05c70b4ee3f2be2f071a2ec2780c0b65b0593b047e735ebf238b5dd75c5746b5"


def test_hard_scenes_hold_many_objects_at_several_scales(scenes) -> None:
    counts, sides = [], []
    for _, _, instances in scenes:
        counts.append(len(instances))
        for inst in instances:
            ys, xs = np.nonzero(inst["mask"])
            sides.append(max(xs.max() - xs.min(), ys.max() - ys.min()) + 1)
    sides = np.array(sides)
    assert np.mean(counts) >= 4 and min(counts) >= 3
    assert (sides < 32).mean() > 0.3  # smaller than one coarse (32 px) patch
    assert (sides > IMG // 2).sum() >= 5  # larger than half the image
    categories = {HARD_THINGS[i["category"]] for _, _, inst in scenes for i in inst}
    assert categories == set(HARD_THINGS)  # every class: patterns, outlines, thin structures


def test_thin_classes_are_one_to_three_finest_cells_wide(scenes) -> None:
    """No 2-cell square fits inside a thin structure (so it spans at most 3 cells across), a 3 px
    one does (it is not a hairline a finest token could miss)."""
    thin = [i for _, _, inst in scenes for i in inst if HARD_THINGS[i["category"]] in THIN]
    assert len(thin) >= 20
    for inst in thin:
        assert not erode(inst["mask"], 2 * CELL + 1).any()
    assert np.mean([erode(i["mask"], 3).any() for i in thin]) > 0.9  # occlusion may leave slivers


def test_objects_touch_and_occlude(scenes) -> None:
    """Some objects touch or overlap others (a later one hides part of an earlier one)."""
    touching = 0
    for _, _, instances in scenes:
        for a in range(len(instances)):
            grown = ~erode(~instances[a]["mask"], 3)  # dilated by a pixel
            touching += sum(bool((grown & instances[b]["mask"]).any()) for b in range(a + 1, len(instances)))
    assert touching >= len(scenes) // 2


def test_background_is_a_natural_texture_not_noise() -> None:
    """Busy (high variance) yet structured: neighbouring pixels correlate, unlike the default's noise."""
    img = natural_texture(np.random.default_rng(0), IMG).mean(-1)
    assert img.std() > 0.05
    a, b = img[:, :-1].ravel(), img[:, 1:].ravel()
    assert np.corrcoef(a, b)[0, 1] > 0.8


def test_outlined_classes_differ_only_at_the_outline(scenes) -> None:
    """An outlined object's inside is one flat colour: its class is on its edge."""
    seen = 0
    for img, _, instances in scenes:
        for inst in instances:
            if HARD_THINGS[inst["category"]] not in OUTLINED:
                continue
            inner = erode(inst["mask"], 7)  # 3 px in from the (visible) edge
            if inner.sum() > 16:
                assert img[inner].astype(float).std(0).max() < 12  # flat, but for the pixel noise
                seen += 1
    assert seen >= 5


def test_hard_files_load_through_the_data_modules(tmp_path) -> None:
    from splitlab.data import (
        ADE20KData,
        CocoDetectionData,
        ImageClassificationData,
        generate_ade20k,
        generate_coco,
        generate_shapes,
    )

    ade = generate_ade20k(tmp_path / "ade", train=4, val=2, difficulty="hard")
    meta = json.loads((ade / "splitlab_dataset.json").read_text())
    assert meta["num_classes"] == 10 and [meta["classes"][i] for i in meta["thin_classes"]] == list(THIN)
    dm = ADE20KData(root=str(ade), num_classes=10, img_size=128, num_workers=0, batch_size=2)
    dm.setup("fit")
    _, mask = dm.datasets["train"][0]
    assert mask.shape == (128, 128) and int(mask.max()) < 10

    coco = generate_coco(tmp_path / "coco", train=4, val=2, difficulty="hard")
    dm = CocoDetectionData(root=str(coco), img_size=128, masks=True, num_workers=0, batch_size=2)
    dm.setup("fit")
    _, target = dm.datasets["train"][0]
    assert target["masks"].shape[0] == target["boxes"].shape[0] >= 3
    assert dm.num_classes == len(HARD_THINGS)

    shapes = generate_shapes(tmp_path / "shapes", train=2, val=1, test=1, difficulty="hard")
    dm = ImageClassificationData(
        root=str(shapes),
        objects="objects.json",
        augment=False,
        val_split="val",
        img_size=64,
        num_workers=0,
        batch_size=4,
    )
    dm.setup("fit")
    images, labels, boxes = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 64, 64) and len(dm.classes) == 6 and boxes.shape == (4, 4)


def test_the_cli_writes_hard_scenes(tmp_path) -> None:
    from splitlab.commands import run

    args = [
        "data",
        "ade20k",
        "--out",
        str(tmp_path / "a"),
        "--train",
        "2",
        "--val",
        "1",
        "--difficulty",
        "hard",
    ]
    assert run(args) == 0
    assert json.loads((tmp_path / "a" / "splitlab_dataset.json").read_text())["difficulty"] == "hard"
    with pytest.raises(ValueError, match="difficulty='harder'"):
        from splitlab.data import generate_coco

        generate_coco(tmp_path / "c", train=1, val=1, difficulty="harder")
