"""COCO data: missing images named, bad boxes dropped and counted, crowd regions flagged and aligned."""

from __future__ import annotations

import json

import pytest


def test_coco_json_naming_missing_images(tmp_path) -> None:
    from splitlab.data import generate_coco
    from splitlab.data.detection import load_coco

    root = generate_coco(tmp_path / "coco", img_size=64, train=3, val=2)
    (root / "val2017" / "000000000001.png").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"instances_val2017.json names 1 image\(s\) missing from .*val2017, e.g. 000000000001.png",
    ):
        load_coco(root / "annotations" / "instances_val2017.json", root / "val2017")


def test_bad_boxes_are_dropped_with_a_counted_warning(tmp_path) -> None:
    from splitlab.data import generate_coco
    from splitlab.data.detection import CocoDetection, letterbox
    from splitlab.model import Preprocessing

    root = generate_coco(tmp_path / "coco", img_size=64, train=2, val=2)
    path = root / "annotations" / "instances_val2017.json"
    doc = json.loads(path.read_text())
    doc["annotations"][0]["bbox"] = [10, 10, 0, 5]  # zero area
    doc["annotations"][1]["bbox"] = [70, 10, 30, 30]  # wholly beyond a 64 px image
    doc["annotations"][2]["bbox"] = [50, 50, 30, 30]  # reaching past its border: clamped, kept
    path.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="dropped 2 annotation"):
        ds = CocoDetection(
            root / "val2017",
            path,
            letterbox(Preprocessing(64, (0.5,) * 3, (0.5,) * 3), False),
            masks=True,
            img_size=64,
        )
    clamped = doc["annotations"][2]
    image, target = ds[ds.ids.index(clamped["image_id"])]
    assert (
        image.shape == (3, 64, 64)
        and target["boxes"].shape[0] == target["labels"].shape[0] == target["masks"].shape[0]
    )
    assert [50.0, 50.0, 64.0, 64.0] in target["boxes"].tolist()
    with pytest.raises(ValueError, match="malformed COCO annotations"):
        path.write_text(json.dumps({"images": [{"id": 1}], "annotations": [{"image_id": 1}]}))
        CocoDetection(
            root / "val2017",
            path,
            letterbox(Preprocessing(64, (0.5,) * 3, (0.5,) * 3), False),
            masks=False,
            img_size=64,
        )


def test_crowd_regions_come_flagged_and_stay_aligned(tmp_path) -> None:
    """A crowd annotation is kept with ``iscrowd`` and its annotated ``area`` (for evaluation), and
    every per-box field stays aligned when the letterbox drops a degenerate box."""
    from splitlab.data import generate_coco
    from splitlab.data.detection import CocoDetection, letterbox
    from splitlab.model import Preprocessing

    root = generate_coco(tmp_path / "coco", img_size=64, train=2, val=2)
    path = root / "annotations" / "instances_val2017.json"
    doc = json.loads(path.read_text())
    first = [a for a in doc["annotations"] if a["image_id"] == doc["images"][0]["id"]]
    crowd = dict(first[0], id=9001, iscrowd=1, area=123.0, bbox=[2, 2, 20, 20])
    crowd["segmentation"] = [[2, 2, 22, 2, 22, 22, 2, 22]]
    degenerate = dict(first[0], id=9002, bbox=[30, 30, 0.5, 0.5], area=0.25)  # under a pixel
    degenerate["segmentation"] = [[30, 30, 30.5, 30, 30.5, 30.5]]
    doc["annotations"] += [crowd, degenerate]
    path.write_text(json.dumps(doc))
    prep = Preprocessing(64, (0.5,) * 3, (0.5,) * 3)
    evaluated = CocoDetection(root / "val2017", path, letterbox(prep, False), masks=True, img_size=64)
    assert evaluated[0][1]["boxes"].shape[0] == len(first) + 2  # evaluation keeps every annotation
    ds = CocoDetection(root / "val2017", path, letterbox(prep, True), masks=True, img_size=64)
    _, target = ds[0]
    n = target["boxes"].shape[0]
    assert n == len(first) + 1  # training drops the degenerate box, the crowd stays
    assert all(target[k].shape[0] == n for k in ("labels", "masks", "iscrowd", "area"))
    assert target["iscrowd"].tolist() == [0] * len(first) + [1]
    assert target["area"][-1].item() == 123.0


def test_images_are_read_upright_and_turned_photos_with_stored_boxes_are_named(tmp_path) -> None:
    """A photo stored turned (EXIF orientation 6) whose boxes were drawn upright reads as its upright
    twin, as predict reads it; one whose boxes were drawn on the stored pixels (the annotations' width
    and height are the stored ones) is a bad sample naming ``exif_transpose``, and reads as stored
    with it off. A 16-bit image reads as its 8-bit twin."""
    import numpy as np
    import torch
    from PIL import ExifTags, Image

    from splitlab.data.common import BadSample
    from splitlab.data.detection import CocoDetection, letterbox
    from splitlab.model import Preprocessing
    from tests.model.user_images import picture, sixteen_bit

    up = picture()  # 256 x 192
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(up).save(folder / "twin.png")
    Image.fromarray(np.ascontiguousarray(np.rot90(up))).save(folder / "turned.png", exif=exif)
    Image.fromarray(up).save(folder / "stored.png", exif=exif)  # boxes drawn on these pixels
    Image.fromarray(sixteen_bit(up)).save(folder / "deep.png")
    names = ["twin.png", "turned.png", "stored.png", "deep.png"]
    doc = {
        "images": [{"id": i + 1, "file_name": n, "width": 256, "height": 192} for i, n in enumerate(names)],
        "annotations": [
            {
                "id": i + 1,
                "image_id": i + 1,
                "category_id": 1,
                "bbox": [16, 24, 80, 40],
                "area": 3200,
                "iscrowd": 0,
            }
            for i in range(len(names))
        ],
        "categories": [{"id": 1, "name": "thing"}],
    }
    annotations = tmp_path / "instances.json"
    annotations.write_text(json.dumps(doc))
    for upright in (True, False):
        prep = Preprocessing(64, (0.5,) * 3, (0.5,) * 3, exif_transpose=upright)
        ds = CocoDetection(
            folder, annotations, letterbox(prep, False), masks=False, img_size=64, exif_transpose=upright
        )
        twin, target = ds[0]
        assert torch.equal(ds[3][0], twin) and torch.equal(ds[3][1]["boxes"], target["boxes"])
        assert torch.equal(ds[0][0], prep(Image.open(folder / "twin.png"))[0])
        if upright:
            assert torch.equal(ds[1][0], twin) and torch.equal(
                ds[1][0], prep(Image.open(folder / "turned.png"))[0]
            )
            with pytest.raises(
                BadSample, match=r"stored.png: read upright .* 192x256, its annotations say 256x192"
            ):
                ds[2]
        else:
            assert torch.equal(ds[2][0], twin) and not torch.equal(ds[1][0], twin)
