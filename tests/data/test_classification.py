"""`ImageClassificationData`: ImageFolder and Hugging Face sources, and what it refuses or skips."""

from __future__ import annotations

import pytest
import torch

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
        img, (x0, y0, x1, y1) = render("checks", rng, size=64, background=background)
        entropy = patch_entropy(torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255, 8)[0]
        cells = torch.zeros(8, 8, dtype=torch.bool)  # 8 px cells the object touches
        cells[y0 // 8 : (y1 - 1) // 8 + 1, x0 // 8 : (x1 - 1) // 8 + 1] = True
        on, off = entropy[cells], entropy[~cells]
        if object_wins:
            assert off.max() == 0 and on.min() > 0
        else:
            assert off.min() > on.median() + 2
