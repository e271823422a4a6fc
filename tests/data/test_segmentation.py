"""ADE20K data: labels above num_classes are refused up front (or, with strict, at the sample)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image


def test_annotation_labels_above_num_classes(tmp_path) -> None:
    from splitlab.data import ADE20KData, generate_ade20k

    root = generate_ade20k(tmp_path / "ade", img_size=64, train=20, val=2)
    masks = sorted((root / "annotations" / "training").glob("*.png"))

    def corrupt(path):
        labels = np.asarray(Image.open(path)).copy()
        labels[0, 0] = 9
        Image.fromarray(labels).save(path)

    settings = {
        "root": str(root),
        "num_classes": 5,
        "img_size": 64,
        "num_workers": 0,
        "scale_range": (1.0, 1.0),
    }
    first = masks[0].read_bytes()
    corrupt(masks[0])
    with pytest.raises(
        ValueError, match=f"annotation .*{masks[0].name}: label value 9 is above num_classes=5"
    ):
        ADE20KData(**settings).setup("fit")  # the first masks are read up front, before any training
    masks[0].write_bytes(first)
    corrupt(masks[18])  # beyond the masks read up front: found when the sample is read
    train = ADE20KData(**settings, strict=True)._subset("training", training=True)
    with pytest.raises(
        ValueError,
        match=r"label value 9 is above num_classes=5: set model.init_args.num_classes=9 .*\(data.init_args.strict=true\)",
    ):
        train[18]  # strict: the bad sample is an error, not skipped
    image, mask = train[0]  # good samples still read
    assert image.shape == (3, 64, 64) and mask.shape == (64, 64) and mask.max() < 5


def test_an_unreadable_image_is_left_to_skipping(tmp_path) -> None:
    """The up-front check passes over an unreadable file (the read skips and counts it), where a
    mask of the wrong size stops before training."""
    from splitlab.data import ADE20KData, generate_ade20k

    root = generate_ade20k(tmp_path / "ade", img_size=64, train=4, val=2)
    images = sorted((root / "images" / "training").glob("*.png"))
    images[0].write_bytes(b"not an image")
    dm = ADE20KData(root=str(root), num_classes=5, img_size=64, num_workers=0)
    dm.setup("fit")
    with pytest.warns(UserWarning, match=f"skipping .*{images[0].name}"):
        dm.datasets["train"][0]
    assert "skipped 1 read(s)" in dm.skipped_report()
    Image.new("L", (32, 32)).save(root / "annotations" / "training" / images[1].name)
    with pytest.raises(ValueError, match=f"{images[1].name}: size 32x32 differs from its image"):
        ADE20KData(root=str(root), num_classes=5, img_size=64, num_workers=0).setup("fit")


def test_reduce_zero_label_as_mmseg() -> None:
    """0 (unlabelled) becomes the ignore index, the rest moves down by one, and a value already at the
    ignore index stays ignored (mmseg's ``reduce_zero_label``), not class 254."""
    import torch

    from splitlab.data.segmentation import labels

    raw = np.array([[0, 1, 150], [255, 2, 0]], dtype=np.uint8)
    got = labels(raw, num_classes=150, ignore_index=255, reduce_zero_label=True, name="m.png")
    assert torch.equal(got, torch.tensor([[255, 0, 149], [255, 1, 255]]))
    kept = labels(raw, num_classes=151, ignore_index=255, reduce_zero_label=False, name="m.png")
    assert torch.equal(kept, torch.from_numpy(raw.astype(np.int64)))


def ade_as_hf(root, out):
    """The generated ADE20K folders as a `datasets` dict in ``scene_parse_150``'s format (splits
    ``train`` and ``validation``; ``image`` and ``annotation`` image columns)."""
    import datasets

    def split(name):
        images = sorted((root / "images" / name).glob("*.png"))
        columns = {
            "image": [str(p) for p in images],
            "annotation": [str(root / "annotations" / name / p.name) for p in images],
            "scene_category": [0] * len(images),
        }
        features = datasets.Features(
            image=datasets.Image(), annotation=datasets.Image(), scene_category=datasets.Value("int64")
        )
        return datasets.Dataset.from_dict(columns, features=features)

    datasets.DatasetDict(train=split("training"), validation=split("validation")).save_to_disk(str(out))
    return out


def test_hf_dataset_reads_as_the_folder_layout(tmp_path) -> None:
    """The Hugging Face path gives the same (image, mask) pairs as the ADE20K folders, checks the first
    masks before training, skips and counts a bad one later, and a wrong split name lists the splits."""
    import datasets
    import torch

    from splitlab.data import ADE20KData, SeededIndex, generate_ade20k

    root = generate_ade20k(tmp_path / "ade", img_size=64, train=20, val=3)
    path = ade_as_hf(root, tmp_path / "hf")
    settings = {"num_classes": 5, "img_size": 64, "num_workers": 0, "scale_range": (1.0, 1.0)}
    from_hf = ADE20KData(hf_dataset=str(path), train_split="train", **settings)
    from_hf.setup("fit")
    from_folders = ADE20KData(root=str(root), **settings)
    from_folders.setup("fit")
    assert len(from_hf.datasets["train"]) == 20 and len(from_hf.datasets["val"]) == 3
    for index in range(3):
        (image, mask), (want_image, want_mask) = (
            from_hf.datasets["val"][index],
            from_folders.datasets["val"][index],
        )
        assert torch.equal(image, want_image) and torch.equal(mask, want_mask)
    assert from_hf.val_dataloader().batch_size == 16

    with pytest.raises(
        FileNotFoundError,
        match=r"data.train_split='training': no such split in data.hf_dataset=.*; splits: \['train', 'validation'\]",
    ):
        ADE20KData(hf_dataset=str(path), **settings).setup("fit")  # ADE20K's folder name, not the hub's

    def with_label_nine(row_index):
        splits = datasets.load_from_disk(str(path))
        mask = np.asarray(splits["train"][row_index]["annotation"]).copy()
        mask[0, 0] = 9

        def edit(row, i):
            return {"annotation": Image.fromarray(mask)} if i == row_index else {}

        splits["train"] = splits["train"].map(edit, with_indices=True)
        out = tmp_path / f"bad{row_index}"
        splits.save_to_disk(str(out))
        return ADE20KData(hf_dataset=str(out), train_split="train", **settings)

    with pytest.raises(ValueError, match=r"\[train\]\[2\]: label value 9 is above num_classes=5"):
        with_label_nine(2).setup("fit")  # among the rows checked up front: before any training
    late = with_label_nine(18)
    late.setup("fit")  # beyond them: skipped and counted when read
    with pytest.warns(UserWarning, match=r"skipping data.hf_dataset=.*\[train\]\[18\]"):
        image, mask = late.datasets["train"][SeededIndex(18, 5)]
    # the next row is served instead, augmented as on the next attempt (seed + 1)
    assert torch.equal(mask, from_folders.datasets["train"][SeededIndex(19, 6)][1])
    assert "skipped 1 read(s)" in late.skipped_report()


def test_images_are_read_upright_and_masks_on_the_stored_pixels_are_named(tmp_path) -> None:
    """Validation reads a 16-bit image as predict reads it (not white); a photo its EXIF orientation
    turns, whose mask was drawn on the stored pixels, is refused before training naming
    ``exif_transpose``, and reads as stored with it off."""
    import torch
    from PIL import ExifTags

    from splitlab.data import ADE20KData, generate_ade20k
    from tests.model.user_images import sixteen_bit

    root = generate_ade20k(tmp_path / "ade", img_size=64, train=2, val=2)
    settings = {"root": str(root), "num_classes": 5, "img_size": 64, "num_workers": 0}
    val = sorted((root / "images" / "validation").glob("*.png"))
    grey = np.asarray(Image.open(val[0]).convert("L"))
    grey = ((grey.astype(float) - grey.min()) * 255 / (grey.max() - grey.min())).round().astype(np.uint8)
    Image.fromarray(sixteen_bit(grey)).save(val[0])
    dm = ADE20KData(**settings)
    dm.setup("validate")
    image, _ = dm.datasets["val"][0]
    assert torch.equal(image, dm.preprocessing(Image.open(val[0]))[0])
    assert torch.equal(image, dm.preprocessing(Image.fromarray(grey))[0]) and image.std() > 0.5

    mask = root / "annotations" / "validation" / val[1].name  # wide: image and mask 64 x 40
    Image.open(mask).crop((0, 0, 64, 40)).save(mask)
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    Image.open(val[1]).convert("RGB").crop((0, 0, 64, 40)).save(val[1], exif=exif)
    with pytest.raises(
        ValueError, match=r"size 40x64 differs from its image \(64x40\); .*exif_transpose=false"
    ):
        ADE20KData(**settings).setup("validate")
    as_stored = ADE20KData(**settings, exif_transpose=False)
    as_stored.setup("validate")
    image, labels = as_stored.datasets["val"][1]
    assert as_stored.preprocessing.exif_transpose is False
    assert torch.equal(image, as_stored.preprocessing(Image.open(val[1]))[0]) and labels.shape == (64, 64)
