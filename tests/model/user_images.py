"""A folder of image files as users have them, built at test time (nothing binary is committed): one
generated shapes picture as an 8-bit upright PNG and the same pixels as 16-bit TIFF and PNG, 32-bit
and float TIFF, palette (with transparency), LA, RGBA, CMYK, 1-bit, an animated GIF, and a JPEG
stored sideways with EXIF orientation 6 beside its upright JPEG twin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import ExifTags, Image

from splitlab.data.generators.shapes import render

LOW, HIGH = 7967, 57825  # the 16-bit range of the TIFF
BLOCK = 8  # JPEG's block: each picture pixel a flat 8x8 block, so turning it changes no coefficient
LOSSLESS = (
    "grey16.tif",
    "grey16.png",
    "grey32.tif",
    "float.tif",
    "palette.png",
    "la.png",
    "rgba.png",
    "cmyk.tif",
    "animated.gif",
)


def picture(seed: int = 0, width: int = 32, height: int = 24) -> np.ndarray:
    """A shapes picture (vertical stripes) as 8-bit grey spanning 0..255, each pixel a flat
    `BLOCK` x `BLOCK` block: ``(height * BLOCK, width * BLOCK)`` uint8, wider than high."""
    rgb, _ = render(
        "vstripes", np.random.default_rng(seed), img_size=max(width, height), object_size=(10, 14)
    )
    grey = rgb[:height, :width].astype(np.float64).mean(-1)
    grey = np.round((grey - grey.min()) * 255 / (grey.max() - grey.min())).astype(np.uint8)
    return np.kron(grey, np.ones((BLOCK, BLOCK), dtype=np.uint8))


def sixteen_bit(grey: np.ndarray) -> np.ndarray:
    """The 8-bit values spread over `LOW`..`HIGH` (what a 16-bit scanner file holds)."""
    return np.round(LOW + grey.astype(np.float64) * (HIGH - LOW) / 255).astype(np.uint16)


def write_user_images(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Every kind of file of `LOSSLESS` plus ``upright.png`` (the 8-bit twin), ``bilevel.png``,
    ``upright.jpg``, ``rotated.jpg`` (stored turned, EXIF orientation 6) and ``sideways.png`` (the
    rotated JPEG's stored pixels, losslessly), by name."""
    folder.mkdir(parents=True, exist_ok=True)
    up = picture(seed)
    paths = {name: folder / name for name in ("upright.png", *LOSSLESS, "bilevel.png")}
    Image.fromarray(up).save(paths["upright.png"])
    deep = sixteen_bit(up)
    Image.fromarray(deep).save(paths["grey16.tif"])
    Image.fromarray(deep).save(paths["grey16.png"])
    Image.fromarray(up.astype(np.int32) * 1000 - 90_000).save(paths["grey32.tif"])
    Image.fromarray(up.astype(np.float32) * 0.0125 - 1.5).save(paths["float.tif"])
    palette = Image.fromarray(up).convert("P")  # a grey palette: every level kept
    palette.save(paths["palette.png"], transparency=0)
    alpha = np.tile(np.linspace(0, 255, up.shape[1]).astype(np.uint8), (up.shape[0], 1))
    Image.fromarray(np.stack([up, alpha], -1), "LA").save(paths["la.png"])
    Image.fromarray(np.stack([up, up, up, alpha], -1), "RGBA").save(paths["rgba.png"])
    Image.fromarray(up).convert("RGB").convert("CMYK").save(paths["cmyk.tif"])
    later = Image.fromarray(255 - up)
    Image.fromarray(up).save(
        paths["animated.gif"], save_all=True, append_images=[later], duration=100, loop=0
    )
    Image.fromarray(up).convert("1").save(paths["bilevel.png"])
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6  # how a phone stores a portrait photo: turned, tagged
    paths["upright.jpg"], paths["rotated.jpg"] = folder / "upright.jpg", folder / "rotated.jpg"
    Image.fromarray(up).save(paths["upright.jpg"], quality=95)
    Image.fromarray(np.ascontiguousarray(np.rot90(up))).save(paths["rotated.jpg"], quality=95, exif=exif)
    paths["sideways.png"] = folder / "sideways.png"
    with Image.open(paths["rotated.jpg"]) as stored:
        stored.convert("RGB").save(paths["sideways.png"])
    return paths
