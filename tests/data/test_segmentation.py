"""Dense tasks: the feature pyramid, EVA-02, evaluation against pycocotools and mmseg, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image


def test_annotation_labels_above_num_classes(tmp_path) -> None:
    from splitlab.data import ADE20KData, generate_ade20k

    root = generate_ade20k(tmp_path / "ade", image_size=64, train=2, val=2)
    bad = sorted((root / "annotations" / "training").glob("*.png"))[0]
    labels = np.asarray(Image.open(bad)).copy()
    labels[0, 0] = 9
    Image.fromarray(labels).save(bad)
    dm = ADE20KData(root=str(root), num_classes=5, img_size=64, num_workers=0, scale_range=(1.0, 1.0))
    with pytest.raises(ValueError, match=f"annotation .*{bad.name}: label value 9 is above num_classes=5"):
        dm.setup("fit")  # the first masks are read up front, before any training
    dm = ADE20KData(
        root=str(root), num_classes=5, img_size=64, num_workers=0, scale_range=(1.0, 1.0), strict=True
    )
    dm.datasets["val"] = dm._split("validation", training=False)
    image, mask = dm.datasets["val"][0]
    assert image.shape == (3, 64, 64) and mask.shape == (64, 64) and mask.max() < 5
