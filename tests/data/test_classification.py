"""`ImageClassificationData`: ImageFolder and Hugging Face sources, and what it refuses or skips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import fit


def test_missing_dataset_path(tmp_path) -> None:
    # raised while the CLI instantiates the DataModule (jsonargparse wraps it): before any model is built
    with pytest.raises(
        (FileNotFoundError, ValueError), match="data.root='/no/such/dataset': no such directory"
    ):
        fit("/no/such/dataset", tmp_path)


def test_empty_class_folder(shapes_root, tmp_path) -> None:
    import shutil

    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    for f in (root / "val" / "dots").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match=r"class folder\(s\) \['dots'\] in val/ hold no image files"):
        fit(root, tmp_path / "logs")


def test_hf_dataset_from_a_local_path(tmp_path) -> None:
    from splitlab.data import ImageClassificationData, generate_shapes

    path = generate_shapes(tmp_path / "hf", train=2, val=1, test=1, fmt="hf")
    dm = ImageClassificationData(
        hf_dataset=str(path), val_split="validation", img_size=64, crop_pct=1.0, num_workers=0, batch_size=4
    )
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 64, 64) and dm.classes == ["hstripes", "vstripes", "checks", "dots"]
    assert len(dm.datasets["val"]) == 4 and labels.dtype == torch.int64
    with pytest.raises(ValueError, match="no column \\['img'\\]"):
        ImageClassificationData(hf_dataset=str(path), image_column="img", num_workers=0).setup("fit")


def test_testing_on_an_unlabelled_split_is_refused(tmp_path) -> None:
    """ImageNet-1k's ``test`` split has label -1 everywhere: refused by name before any work."""
    import datasets

    from splitlab.data import ImageClassificationData, generate_shapes

    path = generate_shapes(tmp_path / "hf", train=2, val=1, test=1, fmt="hf")
    splits = datasets.load_from_disk(str(path))
    splits["test"] = splits["test"].map(lambda row: {"label": -1})
    splits.save_to_disk(str(tmp_path / "unlabelled"))
    dm = ImageClassificationData(
        hf_dataset=str(tmp_path / "unlabelled"), val_split="validation", num_workers=0
    )
    with pytest.raises(ValueError, match=r"data.test_split='test' .* has no labels \(label = -1\)"):
        dm.setup("test")
    dm.setup("predict")  # predicting needs no labels


def test_plain_integer_labels_still_count_the_classes(tmp_path) -> None:
    """A label column of plain integers (no ``ClassLabel`` names) gives classes 0..max, so the model's
    ``num_classes`` is checked against the data as with named classes; a wrong split is named."""
    import datasets

    from splitlab.data import ImageClassificationData, generate_shapes

    path = generate_shapes(tmp_path / "hf", train=2, val=1, test=1, fmt="hf")
    splits = datasets.load_from_disk(str(path))
    for name in splits:
        splits[name] = splits[name].cast_column("label", datasets.Value("int64"))
    splits.save_to_disk(str(tmp_path / "plain"))
    dm = ImageClassificationData(hf_dataset=str(tmp_path / "plain"), val_split="validation", num_workers=0)
    dm.setup("fit")
    assert dm.num_classes == 4 and dm.classes == ["0", "1", "2", "3"]
    with pytest.raises(
        FileNotFoundError,
        match=r"data.val_split='val': no such split in data.hf_dataset=.*; splits: \['test', 'train', 'validation'\]",
    ):
        ImageClassificationData(hf_dataset=str(tmp_path / "plain"), num_workers=0).setup("fit")


@pytest.mark.parametrize("fmt", ["imagefolder", "hf"])
def test_generated_shapes_record_where_each_object_is(tmp_path, fmt) -> None:
    """``objects.json`` names every image of every split with its object's box, inside the image and
    of the generator's object size (what scripts/object_misses.py reads)."""
    import json

    from splitlab.data import generate_shapes

    root = generate_shapes(tmp_path / fmt, train=2, val=1, test=1, fmt=fmt)
    objects = json.loads((root / "objects.json").read_text())
    assert {split: len(boxes) for split, boxes in objects.items()} == {"train": 8, "val": 4, "test": 4}
    for split, boxes in objects.items():
        for key, (x0, y0, x1, y1) in boxes.items():
            if fmt == "imagefolder":
                assert (root / key).is_file() and key.startswith(f"{split}/")
            assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
            assert x1 - x0 == y1 - y0 and 12 <= x1 - x0 <= 20  # squares of 3/16 to 5/16 of the side


def test_on_a_flat_background_the_object_is_the_only_busy_region() -> None:
    """``--background flat``: pixel entropy (APT's cue) is zero on every patch off the object and high
    on the object's patches; on the default busy background every texture patch out-scores the object's
    typical patch (its two colours), so entropy points away from the object."""
    import numpy as np

    from splitlab.data.generators.shapes import render
    from splitlab.tokenizer import patch_entropy

    rng = np.random.default_rng(0)
    for background, object_wins in (("flat", True), ("busy", False)):
        img, (x0, y0, x1, y1) = render("checks", rng, img_size=64, background=background)
        entropy = patch_entropy(torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255, 8)[0]
        cells = torch.zeros(8, 8, dtype=torch.bool)  # 8 px cells the object touches
        cells[y0 // 8 : (y1 - 1) // 8 + 1, x0 // 8 : (x1 - 1) // 8 + 1] = True
        on, off = entropy[cells], entropy[~cells]
        if object_wins:
            assert off.max() == 0 and on.min() > 0
        else:
            assert off.min() > on.median() + 2


def test_folders_and_hf_rows_read_files_as_predict_does(tmp_path) -> None:
    """16-bit PNGs train and validate on their own pixels, not on white; a turned phone photo is read
    upright (as stored with ``exif_transpose`` off, which the model keeps for predict); what is dropped
    is said once per split, not once per file. Hugging Face rows read alike."""
    import shutil
    import warnings
    from pathlib import Path

    import datasets
    from PIL import Image

    from splitlab.data import ImageClassificationData
    from splitlab.model.images import ImageConversionWarning
    from splitlab.model.predict import InputImages
    from tests.model.user_images import write_user_images

    files = write_user_images(tmp_path / "files")
    root = tmp_path / "folder"
    layout = {
        "deep": ("grey16.png", "grey16.tif", "rotated.jpg"),
        "clear": ("rgba.png", "la.png", "palette.png"),
    }
    for split in ("train", "val"):
        for label, names in layout.items():
            (root / split / label).mkdir(parents=True)
            for name in names:
                shutil.copy(files[name], root / split / label / name)
    settings = {"img_size": 64, "crop_pct": 1.0, "num_workers": 0, "batch_size": 2, "augment": False}
    for upright in (True, False):
        dm = ImageClassificationData(root=str(root), exif_transpose=upright, **settings)
        dm.setup("fit")
        assert dm.preprocessing.exif_transpose is upright  # what the model keeps for predict
        val, train = dm.datasets["val"], dm.datasets["train"]
        paths = [path for path, _ in val.dataset.samples]
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            items = {Path(p).name: val[i][0] for i, p in enumerate(paths)}
            trained = {Path(p).name: train[i][0] for i, (p, _) in enumerate(train.dataset.samples)}
        said = [str(w.message) for w in record if issubclass(w.category, ImageConversionWarning)]
        assert len(said) == 4, said  # transparency and 16-bit, once in each split
        predicted = InputImages(paths, dm.preprocessing)  # predict's decoding and preprocessing
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ImageConversionWarning)
            for i, path in enumerate(paths):
                assert torch.equal(items[Path(path).name], predicted[i][1]), path
        as_white = dm.preprocessing.image_transform(Image.open(files["grey16.png"]).convert("RGB"))
        for name in ("grey16.png", "grey16.tif"):
            assert items[name].std() > 0.5 and trained[name].std() > 0.5  # a picture, not a white page
            assert not torch.equal(items[name], as_white)
            assert torch.equal(items[name], items["palette.png"])  # the same picture, as every kind
        twin = "upright.jpg" if upright else "sideways.png"
        assert torch.equal(items["rotated.jpg"], dm.preprocessing(Image.open(files[twin]))[0])

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    names = ["grey16.png", "rotated.jpg", "rgba.png"]
    rows = {"image": [{"bytes": files[n].read_bytes(), "path": None} for n in names], "label": [0, 1, 0]}
    split = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict({"train": split, "validation": split}).save_to_disk(str(tmp_path / "hf"))
    for upright in (True, False):  # `datasets` alone would turn the photo upright whatever the setting
        dm = ImageClassificationData(
            hf_dataset=str(tmp_path / "hf"), val_split="validation", exif_transpose=upright, **settings
        )
        dm.setup("fit")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ImageConversionWarning)
            predicted = InputImages([files[n] for n in names], dm.preprocessing)
            for i in range(len(names)):
                assert torch.equal(dm.datasets["val"][i][0], predicted[i][1]), names[i]
        twin = "upright.jpg" if upright else "sideways.png"
        assert torch.equal(dm.datasets["val"][1][0], dm.preprocessing(Image.open(files[twin]))[0])


def test_high_depth_dtype_reads_a_16bit_file_as_its_8bit_twin_in_training_and_predict(tmp_path) -> None:
    """``data.high_depth: dtype``: a 16-bit file (values x257) trains, validates and predicts as its
    8-bit twin; the model keeps the setting for predict; an unknown value names the setting."""
    import warnings

    import numpy as np
    from PIL import Image

    from splitlab.data import ImageClassificationData
    from splitlab.model.images import ImageConversionWarning
    from splitlab.model.predict import InputImages
    from tests.model.user_images import picture

    grey = (40 + picture().astype(np.float64) * 160 / 255).round().astype(np.uint8)
    root = tmp_path / "folder"
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            Image.fromarray(grey).save(root / split / label / "8bit.png")
            Image.fromarray(grey.astype(np.uint16) * 257).save(root / split / label / "16bit.png")
    settings = {"img_size": 64, "crop_pct": 1.0, "num_workers": 0, "batch_size": 2, "augment": False}
    dm = ImageClassificationData(root=str(root), high_depth="dtype", **settings)
    dm.setup("fit")
    assert dm.preprocessing.high_depth == "dtype"  # what the model keeps for predict
    val = dm.datasets["val"]
    paths = [path for path, _ in val.dataset.samples]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageConversionWarning)
        items = [val[i][0] for i in range(len(paths))]
        predicted = InputImages(paths, dm.preprocessing)
        assert all(torch.equal(item, items[0]) for item in items)
        assert all(torch.equal(predicted[i][1], items[0]) for i in range(len(paths)))
    with pytest.raises(ValueError, match="data.init_args.high_depth='bits': expected 'range'"):
        ImageClassificationData(root=str(root), high_depth="bits", **settings)


@pytest.mark.parametrize("size", [64, (48, 64), (64, 40)], ids=["square", "wide", "tall"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_object_boxes_move_as_timms_transform_moves_the_pixels(size, training) -> None:
    """A box drawn into an image, through timm's own transform (no augmentation), lands where
    `centre_crop_box` puts it: square and non-square inputs, training's resize and evaluation's."""
    from timm.data import create_transform

    from splitlab.data.objects import centre_crop_box, eval_resize

    shape = (size, size) if isinstance(size, int) else size
    transform = create_transform(
        input_size=(3, *shape), is_training=training, no_aug=True, crop_pct=0.875, interpolation="bilinear",
        mean=(0, 0, 0), std=(1, 1, 1),
    )  # fmt: skip
    for width, height in [(100, 70), (70, 100), (90, 90)]:
        pixels = np.zeros((height, width, 3), dtype=np.uint8)
        pixels[20:50, 30:60] = 255  # the box (30, 20, 60, 50)
        image = transform(Image.fromarray(pixels))[0]
        ys, xs = (image > 0.5).nonzero(as_tuple=True)
        seen = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
        resize = shape if training else eval_resize(size, 0.875)  # as the data module's with_boxes
        moved = centre_crop_box(
            torch.tensor([30.0, 20.0, 60.0, 50.0]), width, height, resize, size, not training
        )
        assert (moved - seen).abs().max() <= 1.5, (width, height, moved, seen)
