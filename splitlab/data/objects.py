"""Object boxes beside classification labels: where a classification image's object is.

A classification label says *what*, not *where*; some datasets also give each image's object box
(ImageNet's localisation boxes for part of its images, the generated shapes' ``objects.json``).
With them the ``oracle`` row and ``label_source: annotations`` work for classification too. The
boxes follow the images through the data module's deterministic geometry (timm's resize of the
shorter side, then a centre crop); a random crop or flip would move the object, so boxes are
refused with augmentation on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

NO_BOX = (0.0, 0.0, 0.0, 0.0)  # an image without a box: no cell is marked


def read_objects(
    path: str | Path, setting: str = "data.init_args.objects"
) -> dict[str, dict[str, list[float]]]:
    """``{split: {key: [x0, y0, x1, y1]}}`` from a JSON file (keys: the image's path under the data
    root, or its row index for a Hugging Face dataset), checked before any work."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{setting}={str(path)!r}: no such file")
    try:
        doc = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{setting}={str(path)!r}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise ValueError(
            f"{setting}={str(path)!r}: expected {{split: {{image: [x0, y0, x1, y1]}}}}, as "
            "`splitlab data shapes` writes objects.json"
        )
    for split, boxes in doc.items():
        for key, box in boxes.items():
            if not (isinstance(box, list) and len(box) == 4 and box[2] >= box[0] and box[3] >= box[1]):
                raise ValueError(
                    f"{setting}={str(path)!r}: {split}/{key}: {box} is not a box [x0, y0, x1, y1]"
                )
    return doc


def centre_crop_box(
    box: Tensor,
    width: int,
    height: int,
    resize_to: int | Sequence[int],
    crop: int | Sequence[int],
    keep_ratio: bool = True,
) -> Tensor:
    """``box`` (xyxy, the image's pixels) in the network input after timm's deterministic geometry,
    clipped to the crop: training without augmentation and evaluation alike.

    ``resize_to`` one side: torchvision's ``Resize(resize_to)`` (the shorter side to ``resize_to``, the
    longer one scaled and truncated: timm's evaluation of a square input). ``(height, width)``: timm's
    ``ResizeKeepRatio`` (``keep_ratio``: the smaller scale that covers it, each side rounded: evaluation
    of a non-square input) or a plain ``Resize`` to it (training without augmentation, square or not:
    it squashes). Then ``CenterCrop(crop)``."""
    if isinstance(resize_to, int):
        short, long = min(width, height), max(width, height)
        new_long = int(resize_to * long / short)
        new_w, new_h = (resize_to, new_long) if width <= height else (new_long, resize_to)
    elif keep_ratio:
        ratio = min(height / resize_to[0], width / resize_to[1])
        new_h, new_w = round(height / ratio), round(width / ratio)
    else:
        new_h, new_w = int(resize_to[0]), int(resize_to[1])
    crop_h, crop_w = (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))
    left, top = int(round((new_w - crop_w) / 2.0)), int(round((new_h - crop_h) / 2.0))
    scale = box.new_tensor([new_w / width, new_h / height, new_w / width, new_h / height])
    moved = box * scale - box.new_tensor([left, top, left, top])
    return torch.minimum(moved.clamp(min=0), box.new_tensor([crop_w, crop_h, crop_w, crop_h]))


def eval_resize(img_size: int | Sequence[int], crop_pct: float) -> int | tuple[int, int]:
    """What timm's evaluation transform resizes to before its centre crop: the shorter side of a
    square input, each side of a non-square one."""
    if isinstance(img_size, int):
        return math.floor(img_size / crop_pct)
    return math.floor(img_size[0] / crop_pct), math.floor(img_size[1] / crop_pct)


class WithBoxes(Dataset):
    """``(image, label)`` items with their object box, ``(image, label, box)``: the box (a float
    ``(4,)``, xyxy in network pixels, zeros where the image has none) moved as the image was.

    Args:
        dataset: yields ``(PIL image, label)``: the transform runs here, so the image's own size is known.
        transform: PIL image -> network input.
        key: index -> the item's key in the boxes (its path under the root, or its row index).
        boxes: ``{key: [x0, y0, x1, y1]}`` of this split.
        resize_to, crop, keep_ratio: the transform's geometry (`centre_crop_box`).
    """

    def __init__(
        self,
        dataset: Any,
        transform: Callable[[Any], Tensor],
        key: Callable[[int], str],
        boxes: dict[str, list[float]],
        resize_to: int | Sequence[int],
        crop: int | Sequence[int],
        keep_ratio: bool = True,
    ) -> None:
        self.dataset, self.transform, self.key, self.boxes = dataset, transform, key, boxes
        self.resize_to, self.crop, self.keep_ratio = resize_to, crop, keep_ratio

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, int, Tensor]:
        image, label = self.dataset[index]
        box = torch.tensor(self.boxes.get(self.key(index), NO_BOX), dtype=torch.float32)
        if box.any():
            box = centre_crop_box(box, image.width, image.height, self.resize_to, self.crop, self.keep_ratio)
        return self.transform(image), label, box

    def missing(self) -> int:
        """How many items have no box."""
        return sum(self.key(i) not in self.boxes for i in range(len(self.dataset)))


def box_cells(boxes: Tensor, cell: int, grid: tuple[int, int]) -> Tensor:
    """``(B, rows, cols)`` bool: the finest cells each image's box ``(B, 4)`` (xyxy pixels) touches."""
    rows = torch.arange(grid[0], device=boxes.device, dtype=boxes.dtype) * cell
    cols = torch.arange(grid[1], device=boxes.device, dtype=boxes.dtype) * cell
    x0, y0, x1, y1 = (boxes[:, i].view(-1, 1) for i in range(4))
    in_rows = (rows[None] < y1) & (rows[None] + cell > y0)  # (B, rows)
    in_cols = (cols[None] < x1) & (cols[None] + cell > x0)
    return in_rows[:, :, None] & in_cols[:, None, :]
