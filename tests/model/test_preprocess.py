"""`Preprocessing`: the data modules' evaluation input and predict's are one transform, and a
letterboxed image's outputs map back to its own pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from splitlab.model import Preprocessing


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("pad", ["corner", "centre"])
@pytest.mark.parametrize(("width", "height"), [(200, 120), (90, 150), (64, 64), (33, 1000)])
def test_placement_is_where_the_letterbox_put_the_image(width, height, pad) -> None:
    prep = Preprocessing(64, (0.5,) * 3, (0.5,) * 3, pad=pad)
    image = picture(width, height)
    # a box around the whole image, through torchvision's letterbox with the image
    box = tv_tensors.BoundingBoxes([[0, 0, width, height]], format="XYXY", canvas_size=(height, width))
    moved_image, moved = prep.transforms()(tv_tensors.Image(v2.functional.pil_to_tensor(image)), box)
    place = prep.placement(width, height)
    x0, y0, x1, y1 = moved[0].tolist()
    assert (x0, y0) == (place.left, place.top) and (y1 - y0, x1 - x0) == place.resized
    assert torch.equal(moved_image, prep(image)[0])
    back = place.boxes_to_input(moved.as_subclass(torch.Tensor))
    assert back[0].tolist() == pytest.approx([0, 0, width, height], abs=1.5 / place.scale)


def test_crop_preprocessing_is_timms_evaluation_transform() -> None:
    from timm.data import create_transform

    prep = Preprocessing(
        64, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3), resize="crop", interpolation="bicubic", crop_pct=0.875
    )
    timm = create_transform(
        input_size=(3, 64, 64), interpolation="bicubic", mean=prep.mean, std=prep.std, crop_pct=0.875
    )
    image = picture(120, 90)
    assert torch.equal(prep(image)[0], timm(image))


def test_the_data_modules_evaluate_on_the_models_input(tmp_path) -> None:
    """What validation reads from a file is what predict computes from it (segmentation pads black
    before normalising, detection with the mean colour after)."""
    from splitlab.data import ADE20KData, CocoDetectionData, generate_ade20k, generate_coco

    ade = generate_ade20k(tmp_path / "ade", img_size=64, train=2, val=2)
    data = ADE20KData(root=str(ade), img_size=96, num_workers=0, batch_size=2)
    data.setup("validate")
    folder = data.datasets["val"].dataset
    image, _ = folder[0]
    assert torch.equal(image, data.preprocessing(Image.open(folder.pairs[0][0]))[0])
    assert data.preprocessing.pad_fill == "black"

    coco = generate_coco(tmp_path / "coco", img_size=64, train=2, val=2)
    data = CocoDetectionData(root=str(coco), img_size=96, num_workers=0)
    data.setup("validate")
    ds = data.datasets["val"].dataset
    image, target = ds[0]
    file = coco / "val2017" / ds.coco.imgs[ds.ids[0]]["file_name"]
    assert torch.equal(image, data.preprocessing(Image.open(file))[0])
    assert data.names and len(data.category_ids) == data.num_classes
