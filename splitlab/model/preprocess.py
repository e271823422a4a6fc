"""What a `SplitModel` expects as input, and where each input image lies in it.

One value object, `Preprocessing`, is the contract between image files and the network: the data
modules build their evaluation transforms from it, the model stores it (``config.json`` and the
checkpoint), and ``predict`` applies it to any file. So predictions on raw files see exactly the
pixels ``lightning validate`` saw, and outputs can be mapped back to each input's own pixels. Files
become RGB pixels in one place, `splitlab.model.images.decode_image`, for the readers and predict alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2

from splitlab.model.images import check_high_depth, decode_image

RESIZES = ("crop", "letterbox")
LETTERBOX_FILTERS = ("bilinear", "bicubic")  # torchvision's antialiased tensor resizes
PADS = ("corner", "centre")
PAD_FILLS = ("mean", "black")


class PadTo(v2.Transform):
    """Pad up to ``size`` x ``size``, bottom/right (or evenly on both sides with ``centre``, as
    LLaVA-1.5's ``expand2square``): images with 0, masks with ``mask_fill``."""

    def __init__(self, size: int, mask_fill: int = 0, centre: bool = False) -> None:
        super().__init__()
        self.size, self.mask_fill, self.centre = size, mask_fill, centre

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        h, w = v2.functional.get_size(inpt)  # of the canvas for boxes, whose shape is (N, 4)
        extra_w, extra_h = max(self.size - w, 0), max(self.size - h, 0)
        left, top = (extra_w // 2, extra_h // 2) if self.centre else (0, 0)
        pad = [left, top, extra_w - left, extra_h - top]
        fill = self.mask_fill if isinstance(inpt, tv_tensors.Mask) else 0
        return v2.functional.pad(inpt, pad, fill=fill)


@dataclass(frozen=True)
class Placement:
    """Where one input image lies in the network's square input (letterbox), to map outputs back.

    Attributes:
        width, height: the input image's own size in pixels.
        scale: network pixels per input pixel.
        left, top: padding before the image, in network pixels.
        resized: ``(height, width)`` of the image inside the network input.
    """

    width: int
    height: int
    scale: float
    left: int = 0
    top: int = 0
    resized: tuple[int, int] = (0, 0)

    def boxes_to_input(self, boxes: Tensor) -> Tensor:
        """``(N, 4)`` xyxy boxes in network pixels -> the input image's pixels, clipped to it."""
        offset = boxes.new_tensor([self.left, self.top, self.left, self.top])
        out = (boxes.float() - offset) / self.scale
        out[:, 0::2] = out[:, 0::2].clamp(0, self.width)
        out[:, 1::2] = out[:, 1::2].clamp(0, self.height)
        return out


def image_sides(size: int | Sequence[int], setting: str = "img_size") -> tuple[int, int]:
    """``(height, width)`` of an image size given as a side or as ``[height, width]``: the one place
    that reads either form (``setting`` names it in the refusal of any other)."""
    if isinstance(size, int | float):
        return int(size), int(size)
    sides = tuple(int(v) for v in size)
    if len(sides) != 2:
        raise ValueError(f"{setting}={list(size)}: give a side or [height, width]")
    return sides


@dataclass(frozen=True)
class Preprocessing:
    """How an image of any size becomes the network's ``img_size`` x ``img_size`` input.

    Attributes:
        img_size: the input side in pixels, or ``(height, width)`` of a non-square input (``crop`` only:
            timm's transform resizes keeping the aspect ratio to cover it, then crops its centre).
        mean, std: normalisation of pixels in ``[0, 1]``.
        resize: ``crop`` (timm's evaluation transform: the shorter side to ``img_size / crop_pct``,
            then a centre crop; classification) or ``letterbox`` (the longer side to ``img_size``, then
            padding to a square; detection, segmentation, VQA: nothing is cut off).
        interpolation: the resize filter: of ``crop``, timm's names; of ``letterbox``, ``bilinear``
            (the default, as the detection and segmentation data modules always did) or ``bicubic``
            (VQA: CLIP's image processor, resample=3), both antialiased.
        crop_pct: share of the resized image the centre crop keeps (``crop``).
        pad: where the letterbox pads: ``corner`` (bottom/right) or ``centre``.
        pad_fill: ``mean`` (padding added after normalising: zeros, the mean colour) or ``black``
            (pixels 0, added before normalising, as the ADE20K transform pads image and mask).
        exif_transpose: files are read upright by their EXIF orientation (the data modules'
            ``exif_transpose``): here so that predict reads files as the model's training data was read.
        high_depth: how 16-bit, 32-bit and float images become 8 bits (the data modules'
            ``high_depth``): ``range`` (each image by its own minimum and maximum, the default) or
            ``dtype`` (by the type's range, as an 8-bit file is read); `splitlab.model.images`.
    """

    img_size: int | tuple[int, int]
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    resize: str = "letterbox"
    interpolation: str = "bilinear"
    crop_pct: float = 1.0
    pad: str = "corner"
    pad_fill: str = "mean"
    exif_transpose: bool = True
    high_depth: str = "range"

    def __post_init__(self) -> None:
        sides = image_sides(self.img_size, "preprocessing img_size")  # [h, w] from config.json, or (h, w)
        object.__setattr__(
            self, "img_size", sides[0] if sides[0] == sides[1] else sides
        )  # a square: its side
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        for name, value, allowed in (
            ("resize", self.resize, RESIZES),
            ("pad", self.pad, PADS),
            ("pad_fill", self.pad_fill, PAD_FILLS),
        ):
            if value not in allowed:
                raise ValueError(f"preprocessing {name}={value!r}: expected one of {allowed}")
        if min(self.shape) < 1:
            raise ValueError(f"preprocessing img_size={self.img_size}: must be positive")
        if self.resize == "letterbox" and self.shape[0] != self.shape[1]:
            raise ValueError(
                f"preprocessing img_size={list(self.shape)}: the letterbox pads to a square (detection, "
                "segmentation, VQA); a non-square input is a classifier's (resize: crop)"
            )
        if not isinstance(self.exif_transpose, bool):
            raise ValueError(f"preprocessing exif_transpose={self.exif_transpose!r}: expected true or false")
        check_high_depth(self.high_depth, "preprocessing high_depth")
        if self.resize == "letterbox" and self.interpolation not in LETTERBOX_FILTERS:
            raise ValueError(
                f"preprocessing interpolation={self.interpolation!r}: the letterbox resizes with one of "
                f"{LETTERBOX_FILTERS}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Preprocessing:
        """From ``config.json`` (unknown keys are refused, naming them)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"preprocessing: unknown settings {unknown}; expected {sorted(known)}")
        return cls(**values)

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)`` of the network input."""
        return image_sides(self.img_size)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["mean"], values["std"] = list(self.mean), list(self.std)
        if not isinstance(self.img_size, int):
            values["img_size"] = list(self.img_size)
        return values

    # ----------------------------------------------------------------------------- transforms
    def transforms(self, mask_fill: int = 0, pre: Sequence[Any] = (), post: Sequence[Any] = ()) -> Any:
        """The evaluation transform on tensors and tv_tensors (image with its boxes or mask), for the
        data modules; ``pre`` and ``post`` steps go around the letterbox (flips, box clamping).

        ``crop`` has no joint form: it is timm's transform on PIL images (`image_transform`).
        """
        if self.resize != "letterbox":
            raise ValueError("transforms() is the letterbox's; crop preprocessing is image_transform")
        normalise = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        pad = PadTo(self.img_size, mask_fill, centre=self.pad == "centre")
        resize = v2.Resize(
            size=None,
            max_size=self.img_size,
            interpolation=v2.InterpolationMode(self.interpolation),
            antialias=True,
        )
        steps = [resize, pad, *normalise] if self.pad_fill == "black" else [resize, *normalise, pad]
        return v2.Compose([*pre, *steps, *post])

    @cached_property
    def image_transform(self) -> Any:
        """PIL image -> ``(3, img_size, img_size)`` normalised tensor (built once)."""
        if self.resize == "crop":
            from timm.data import create_transform

            return create_transform(
                input_size=(3, *self.shape),
                is_training=False,
                interpolation=self.interpolation,
                mean=self.mean,
                std=self.std,
                crop_pct=self.crop_pct,
            )
        letterbox = self.transforms()
        return v2.Compose([v2.PILToTensor(), letterbox])

    def placement(self, width: int, height: int) -> Placement:
        """Where an image of ``width`` x ``height`` lies in the network input (the letterbox's scale
        and padding, computed as torchvision's resize and `PadTo` compute them)."""
        if self.resize == "crop":
            return Placement(width, height, 1.0, resized=self.shape)
        long, short = max(width, height), min(width, height)
        new_short = int(self.img_size * short / long)  # torchvision's size for max_size alone
        new_w, new_h = (self.img_size, new_short) if width >= height else (new_short, self.img_size)
        left, top = (0, 0)
        if self.pad == "centre":
            left, top = (self.img_size - new_w) // 2, (self.img_size - new_h) // 2
        return Placement(width, height, self.img_size / long, left, top, (new_h, new_w))

    def __call__(self, image: Image.Image) -> tuple[Tensor, Placement]:
        """One PIL image of any mode (decoded as the readers decode files: `decode_image`, upright as
        ``exif_transpose`` says, high-depth values as ``high_depth`` says) -> its network input and
        placement."""
        return self.from_rgb(decode_image(image, self.exif_transpose, high_depth=self.high_depth))

    def from_rgb(self, image: Image.Image) -> tuple[Tensor, Placement]:
        """One image `decode_image` gave (8-bit RGB, already upright or not) -> its network input and
        placement."""
        return self.image_transform(image), self.placement(image.width, image.height)
