"""The one image decoder: every reader (training, evaluation) and ``predict`` turn files into the
network's RGB pixels here, so what a model was validated on and what it predicts on cannot drift.

`decode_image` takes a path, a file object or a PIL image of any mode and gives an 8-bit RGB image:

- **orientation**: the EXIF orientation is applied (``ImageOps.exif_transpose``): phones store a
  portrait photo as a landscape one with orientation 6, and every viewer shows it upright.
  ``exif_transpose=False`` reads the pixels as stored (data drawn or annotated on them).
- **bit depth** (``high_depth``): 16- and 32-bit integer images (modes ``I;16*``, ``I``) and float
  images (``F``) become 8 bits in one of two ways. ``range`` (the default) scales each image by *its
  own* range, its minimum to 0 and its maximum to 255 (NaN and infinities to 0; a constant image is
  black, as OpenCV's ``NORM_MINMAX`` makes it): 12-bit data (0..4095, medical and remote-sensing
  scanners) stored in 16-bit files shows its contrast, and float rasters need no fixed range; but
  an image's grey levels then depend on its own extremes, so an 8-bit file and its 16-bit twin
  (values x257) differ. ``dtype`` scales by the type's range, as an 8-bit file is read: 0 to 0 and
  the type's maximum to 255 (16-bit: 65535, or the file's own maximum sample value where it records
  one, TIFF's ``MaxSampleValue``; a 32-bit file: its significant bits, TIFF's ``BitsPerSample``;
  floats: 0..1), values outside clipped, so the twins decode alike. Never PIL's own
  ``convert("RGB")``, which turns every 16-bit value above 255 white.
- **modes**: palette, greyscale, 1-bit and CMYK images converted as PIL converts them; the alpha of
  RGBA, LA, PA and palette-with-transparency images is dropped (the colour stored under transparent
  pixels shows, as torchvision's and timm's loaders have always read them); of an animated or
  multi-page file the first frame is read (of a PIL image, its current frame).

What is lost (alpha, later frames) or rescaled is said by an `ImageConversionWarning` naming the
file. An `ImageDecoder` (one per reader, or per predict run) says each kind once, not once per file.
A file that is not a readable image raises what PIL raises (``OSError``, ``SyntaxError``,
``DecompressionBombError``), which the readers count as skipped.
"""

from __future__ import annotations

import re
import struct
import warnings
from pathlib import Path
from typing import IO

import numpy as np
from PIL import ExifTags, Image, ImageOps

Source = str | Path | IO[bytes] | Image.Image
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
# what PIL raises on a malformed EXIF block (the image itself may be fine: read it as stored)
BAD_EXIF = (OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError, struct.error)
TURNED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


HIGH_DEPTH = ("range", "dtype")  # how 16-bit, 32-bit and float images become 8 bits (module docstring)


def check_high_depth(value: str, setting: str = "high_depth") -> str:
    """``value`` if it is one of `HIGH_DEPTH`, else an error naming ``setting``."""
    if value not in HIGH_DEPTH:
        raise ValueError(
            f"{setting}={value!r}: expected 'range' (each image by its own minimum and maximum) or 'dtype' "
            "(the type's full range, as an 8-bit file is read)"
        )
    return value


class ImageConversionWarning(UserWarning):
    """An image was changed on its way to 8-bit RGB: alpha or frames dropped, bit depth rescaled."""


def is_high_depth(mode: str) -> bool:
    """Whether PIL's ``mode`` holds more than 8 bits per pixel (16/32-bit integers, floats)."""
    return mode in ("I", "F") or mode.startswith("I;16")


def orientation(image: Image.Image) -> int:
    """The EXIF orientation (1: upright; 1 also when the EXIF is unreadable)."""
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
    except BAD_EXIF:
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def decoded_size(image: Image.Image, exif_transpose: bool = True) -> tuple[int, int]:
    """``(width, height)`` that `decode_image` gives ``image`` (an opened file), from its header alone:
    cheap enough to check every file's annotation sizes before training. (A PNG whose EXIF comes
    after the pixels counts as upright here, as decoding it to find out would cost the whole image.)"""
    width, height = image.size
    if not exif_transpose or (image.format == "PNG" and "exif" not in image.info):
        return width, height
    return (height, width) if orientation(image) in TURNED else (width, height)


def type_maximum(image: Image.Image) -> float:
    """The value a high-depth image's type reads as white (``high_depth: dtype``): floats 1; 16-bit
    integers 65535, or the file's own maximum sample value where it records one (TIFF's
    ``MaxSampleValue``); other integers by their significant bits (TIFF's ``BitsPerSample``, the
    decoder's raw mode, else 32). Read before the image is loaded (loading drops the decoder's mode)."""
    if image.mode == "F":
        return 1.0
    tags = getattr(image, "tag_v2", None) or {}
    stated = tags.get(281)  # MaxSampleValue
    stated = stated[0] if isinstance(stated, tuple) and stated else stated
    bits_tag = tags.get(258)  # BitsPerSample
    bits_tag = bits_tag[0] if isinstance(bits_tag, tuple) and bits_tag else bits_tag
    if image.mode.startswith("I;16"):
        bits = 16
    elif isinstance(bits_tag, int) and 8 < bits_tag <= 32:
        bits = bits_tag
    else:  # e.g. an older Pillow's 16-bit PNG: mode I, raw mode I;16B
        raw = next((tile[3] for tile in getattr(image, "tile", []) or [] if len(tile) > 3), None)
        raw = raw[0] if isinstance(raw, tuple) and raw else raw
        found = re.match(r"I;(\d+)", raw) if isinstance(raw, str) else None
        bits = int(found.group(1)) if found else 32
    top = float(2**bits - 1)
    if isinstance(stated, int | float) and 0 < stated < top:
        return float(stated)
    return top


def to_8bit(
    image: Image.Image, high_depth: str = "range", top: float | None = None
) -> tuple[Image.Image, float, float]:
    """A high-depth image as 8-bit greyscale (see the module docstring), and the range ``(low, high)``
    scaled to 0..255: the image's own (``range``), or 0 and ``top`` (``dtype``: default the type's
    maximum, `type_maximum`)."""
    values = np.asarray(image, dtype=np.float64)
    finite = np.isfinite(values)
    if high_depth == "dtype":
        low, high = 0.0, type_maximum(image) if top is None else float(top)
    elif finite.any():
        low, high = float(values[finite].min()), float(values[finite].max())
    else:
        low, high = 0.0, 0.0
    if high > low:
        scaled = np.where(finite, (values - low) * (255.0 / (high - low)), 0.0)
    else:  # no contrast to show
        scaled = np.zeros_like(values)
    return Image.fromarray(np.clip(np.round(scaled), 0, 255).astype(np.uint8), "L"), low, high


def to_rgb(
    image: Image.Image, name: str, high_depth: str = "range", top: float | None = None
) -> tuple[Image.Image, dict[str, str]]:
    """``image`` (loaded, upright) as 8-bit RGB, and what the conversion dropped or changed, by kind;
    ``high_depth`` and ``top`` as `to_8bit` takes them."""
    mode, notes = image.mode, {}
    if mode == "RGB":
        return image, notes
    if is_high_depth(mode):
        grey, low, high = to_8bit(image, high_depth, top)
        bits = "float" if mode == "F" else ("16-bit" if mode.startswith("I;16") else "32-bit")
        if high_depth == "dtype":
            how = f"its type's range 0..{high:g} scaled to 0..255, values outside clipped: high_depth=dtype"
        elif high > low:
            how = f"values {low:g}..{high:g} scaled to 0..255: each image by its own range, high_depth=range"
        else:
            how = f"constant {low:g}, read as black: high_depth=range"
        notes[f"depth {bits}"] = f"{name}: {bits} greyscale ({mode}, {how})"
        return grey.convert("RGB"), notes
    if mode in ALPHA_MODES or "transparency" in image.info:
        notes["alpha"] = (
            f"{name}: its transparency ({mode}) is dropped; the colours stored under transparent pixels show"
        )
        # through RGBA: a palette's transparency (bytes or index) read without PIL's own warning
        base = image.convert("LA") if mode == "La" else image
        try:
            return base.convert("RGBA").convert("RGB"), notes
        except ValueError:  # no RGBA form (LA with a tRNS chunk is read as grey)
            pass
    try:
        return image.convert("RGB"), notes
    except ValueError as err:  # e.g. LAB: PIL has no conversion; counted as unreadable
        raise OSError(f"{name}: PIL cannot convert a {mode} image to RGB ({err})") from None


def frame_note(image: Image.Image, name: str) -> str | None:
    """What is said of a multi-frame image (None for one frame; MPO, a phone JPEG's extra preview
    or depth pictures, is one photograph)."""
    frames = getattr(image, "n_frames", 1)
    if frames <= 1 or image.format == "MPO":
        return None
    return f"{name}: {frames} frames (animated or multi-page); frame {image.tell() + 1} is read, the rest dropped"


def decode(
    image: Image.Image, exif_transpose: bool, name: str, high_depth: str = "range"
) -> tuple[Image.Image, dict[str, str]]:
    """An opened image as 8-bit RGB, upright unless ``exif_transpose`` is off, high-depth values as
    ``high_depth`` says, and the notes of what changed (by kind: ``frames``, ``exif``, ``depth
    <bits>``, ``alpha``)."""
    notes: dict[str, str] = {}
    said = frame_note(image, name)  # counting frames seeks the file: before loading the one read
    if said:
        notes["frames"] = said
    top = type_maximum(image) if high_depth == "dtype" and is_high_depth(image.mode) else None
    image.load()
    if exif_transpose and orientation(image) != 1:
        try:
            image = ImageOps.exif_transpose(image)  # drops the tag: decoding twice turns once
        except BAD_EXIF as err:
            notes["exif"] = f"{name}: its EXIF orientation could not be applied ({err}); read as stored"
    rgb, changed = to_rgb(image, name, high_depth, top)
    return rgb, {**notes, **changed}


def decode_image(
    source: Source,
    exif_transpose: bool = True,
    name: str | None = None,
    warned: set[str] | None = None,
    high_depth: str = "range",
) -> Image.Image:
    """A path, file object or PIL image of any mode as an 8-bit RGB PIL image (see the module docstring).

    Args:
        source: what to decode; a PIL image is not changed (a new image is returned where anything
            is converted).
        exif_transpose: apply the EXIF orientation (off: the pixels as stored).
        name: what to call the image in warnings (default: its file name).
        warned: kinds of `ImageConversionWarning` already given (each is given once, then added);
            None: every call warns (`ImageDecoder` keeps one set per reader).
        high_depth: 16-bit, 32-bit and float images scaled by their own range (``range``) or by
            their type's (``dtype``), see the module docstring.

    Raises:
        OSError, SyntaxError, PIL.Image.DecompressionBombError: not a readable image.
    """
    check_high_depth(high_depth)
    if isinstance(source, Image.Image):
        label = name or getattr(source, "filename", "") or "an image"
        image, notes = decode(source, exif_transpose, label, high_depth)
    else:
        label = name or str(
            source if isinstance(source, str | Path) else getattr(source, "name", "a file object")
        )
        with Image.open(source) as opened:
            image, notes = decode(opened, exif_transpose, label, high_depth)
            if image is opened:  # closing the file closes the image: keep a copy
                image = opened.copy()
    for kind, note in notes.items():
        if warned is None or kind not in warned:
            if warned is not None:
                warned.add(kind)
                note += " (said once: other such images are converted alike)"
            warnings.warn(note, ImageConversionWarning, stacklevel=3)
    return image


class ImageDecoder:
    """`decode_image` with a reader's setting, warning once per kind of conversion (not once per
    file: a folder of 10,000 RGBA PNGs says it once, naming the first). Picklable, so it serves as
    torchvision's ``ImageFolder(loader=...)``; each DataLoader worker process says it once.

    Args:
        exif_transpose: apply each image's EXIF orientation.
        high_depth: ``range`` (default) or ``dtype``: how 16-bit, 32-bit and float images become
            8 bits (the module docstring).
    """

    def __init__(self, exif_transpose: bool = True, high_depth: str = "range") -> None:
        self.exif_transpose = bool(exif_transpose)
        self.high_depth = check_high_depth(high_depth)
        self.warned: set[str] = set()

    def __call__(self, source: Source, name: str | None = None) -> Image.Image:
        return decode_image(source, self.exif_transpose, name, self.warned, self.high_depth)

    def __repr__(self) -> str:
        return f"ImageDecoder(exif_transpose={self.exif_transpose}, high_depth={self.high_depth!r})"
