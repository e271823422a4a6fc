"""ADE20K data: labels above num_classes are refused up front (or, with strict, at the sample)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image


def test_annotation_labels_above_num_classes(tmp_path) -> None:
    from splitlab.data import ADE20KData, generate_ade20k

    root = generate_ade20k(tmp_path / "ade", image_size=64, train=20, val=2)
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
    train = ADE20KData(**settings, strict=True)._split("training", training=True)
    with pytest.raises(
        ValueError, match=r"label value 9 is above num_classes=5 .*\(data.init_args.strict=true\)"
    ):
        train[18]  # strict: the bad sample is an error, not skipped
    image, mask = train[0]  # good samples still read
    assert image.shape == (3, 64, 64) and mask.shape == (64, 64) and mask.max() < 5


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
