"""Small multi-object scenes in the real dense formats: ADE20K layout and COCO instances JSON.

Each image has a busy, high-entropy background in two "stuff" regions (ground and wall, told
apart by colour, so coarse tokens suffice there) and one to three "things": squares or discs whose
class is their inner pattern (horizontal stripes, vertical stripes, checks; 2 px features that a
coarse token averages away). Pixel entropy favours the background; only fine tokens on the
objects recover their class and their boundaries.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from splitlab.data.generators.hard_scenes import (
    HARD_THINGS,
    OUTLINED,
    THIN,
    colours,
    natural_texture,
    outlined_object,
    place,
    textured_object,
    thin_mask,
)
from splitlab.data.generators.shapes import check_img_size, pattern_mask

STUFF = ("ground", "wall")
THINGS = ("hstripes", "vstripes", "checks")
DIFFICULTIES = ("default", "hard")
Scene = tuple[np.ndarray, np.ndarray, list[dict]]  # image, semantic labels, instances
# how crowded a hard scene is: (low, high) counts per image, inclusive
HARD_SMALL, HARD_MEDIUM, HARD_THIN = (2, 4), (0, 1), (1, 2)


def horizon_mask(rng: np.random.Generator, img_size: int) -> np.ndarray:
    """``(H, W)`` bool wall region above a wavy horizon (the rest is ground)."""
    horizon = img_size * rng.uniform(0.3, 0.7) + img_size * 0.08 * np.sin(
        np.arange(img_size) / img_size * 2 * np.pi * rng.uniform(0.5, 2) + rng.uniform(0, 6.3)
    )
    return np.arange(img_size)[:, None] < horizon[None, :]


def _stuff(rng: np.random.Generator, img_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Background image and stuff labels (0 = ground, 1 = wall) split by a wavy horizon."""
    img = np.zeros((img_size, img_size, 3), dtype=np.float32)
    for cell in (2, 4, 8):
        n = img_size // cell
        img += np.kron(rng.random((n, n, 3), dtype=np.float32), np.ones((cell, cell, 1), dtype=np.float32))
    img /= 3.0
    wall = horizon_mask(rng, img_size)
    tint_wall, tint_ground = np.array([0.2, 0.35, 0.75]), np.array([0.7, 0.5, 0.2])
    img = 0.55 * img + 0.45 * np.where(wall[..., None], tint_wall, tint_ground)
    img += rng.normal(0, 0.05, img.shape)
    return np.clip(img, 0, 1), wall.astype(np.int64)


def render_scene(
    rng: np.random.Generator, img_size: int, max_objects: int = 3, detail: int = 2
) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """One scene: ``uint8`` image, semantic labels (0 ground, 1 wall, 2.. things) and instances.

    Instances are ``{"category": thing index, "mask": bool (H, W)}``, drawn back to front.
    """
    img, labels = _stuff(rng, img_size)
    instances = []
    lo, hi = max(img_size // 8, 8), max(img_size // 4, 12)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        thing = int(rng.integers(len(THINGS)))
        side = int(rng.integers(lo, hi + 1))
        x0, y0 = (int(v) for v in rng.integers(0, img_size - side + 1, size=2))
        yy, xx = np.mgrid[0:side, 0:side]
        shape = (
            np.ones((side, side), bool)
            if rng.random() < 0.5
            else ((yy - side / 2 + 0.5) ** 2 + (xx - side / 2 + 0.5) ** 2) <= (side / 2) ** 2
        )
        mask = np.zeros((img_size, img_size), bool)
        mask[y0 : y0 + side, x0 : x0 + side] = shape
        a, b = rng.random(3) * 0.3, 0.7 + rng.random(3) * 0.3
        if rng.random() < 0.5:
            a, b = b, a
        pattern = pattern_mask(THINGS[thing], side, detail)[..., None]
        patch = np.where(pattern, b, a)
        region = img[y0 : y0 + side, x0 : x0 + side]
        img[y0 : y0 + side, x0 : x0 + side] = np.where(shape[..., None], patch, region)
        labels[mask] = len(STUFF) + thing
        for earlier in instances:  # later objects occlude earlier ones
            earlier["mask"] &= ~mask
        instances.append({"category": thing, "mask": mask})
    instances = [i for i in instances if i["mask"].any()]
    return (img * 255).round().astype(np.uint8), labels, instances


def _hard_stuff(rng: np.random.Generator, img_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Background and stuff labels of a hard scene: a natural texture per region, told apart by tint
    (so coarse tokens still suffice for the stuff), split by the wavy horizon."""
    wall = horizon_mask(rng, img_size)
    texture = [natural_texture(rng, img_size) for _ in STUFF]
    tint_wall, tint_ground = np.array([0.2, 0.35, 0.75]), np.array([0.7, 0.5, 0.2])
    img = np.where(wall[..., None], 0.6 * texture[1] + 0.4 * tint_wall, 0.6 * texture[0] + 0.4 * tint_ground)
    return img.astype(np.float32), wall.astype(np.int64)


def _hard_object(
    rng: np.random.Generator,
    img: np.ndarray,
    thing: int,
    side: int,
    near: tuple[int, int] | None,
    detail: int,
) -> np.ndarray:
    """Paint one textured or outlined object of class ``HARD_THINGS[thing]`` into ``img``, touching the
    point ``near`` when given (else anywhere); return its ``(H, W)`` mask."""
    img_size = img.shape[0]
    if near is None:
        x0, y0 = place(rng, img_size, side)
    else:  # against or over an earlier object: its corner within one side of ours
        x0, y0 = (int(np.clip(v - rng.integers(0, side + 1), 0, img_size - side)) for v in near)
    kind = HARD_THINGS[thing]
    if kind in OUTLINED:
        fill, ink = colours(rng)
        patch, shape = outlined_object(kind, rng, side, fill, ink), np.ones((side, side), bool)
    else:
        patch, shape = textured_object(rng, pattern_mask(kind, side, detail))
    region = img[y0 : y0 + side, x0 : x0 + side]
    img[y0 : y0 + side, x0 : x0 + side] = np.where(shape[..., None], patch, region)
    mask = np.zeros(img.shape[:2], bool)
    mask[y0 : y0 + side, x0 : x0 + side] = shape
    return mask


def render_hard_scene(
    rng: np.random.Generator, img_size: int, cell: int = 8, detail: int = 2
) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """A hard scene (`splitlab.data.generators.hard_scenes`), as `render_scene` returns it, with the
    classes of `HARD_THINGS`: small objects (under one coarse patch), a medium one at times, and thin
    structures (``cell``: the finest patch in pixels), in random depth order, some touching."""
    img, labels = _hard_stuff(rng, img_size)
    # at small images the ranges close up to one size (32 px: small objects 12 px, medium 10-12 px)
    small_lo = max(img_size // 10, 3 * cell // 2)
    small = (small_lo, max(small_lo, img_size * 3 // 16))
    medium = (img_size // 5, max(img_size // 5, img_size // 3))
    things = [("small", i) for i in range(int(rng.integers(HARD_SMALL[0], HARD_SMALL[1] + 1)))]
    things += [("medium", i) for i in range(int(rng.integers(HARD_MEDIUM[0], HARD_MEDIUM[1] + 1)))]
    things += [("thin", i) for i in range(int(rng.integers(HARD_THIN[0], HARD_THIN[1] + 1)))]
    instances: list[dict] = []
    last: tuple[int, int] | None = None
    for k in rng.permutation(len(things)):
        size_name = things[int(k)][0]
        if size_name == "thin":
            thing = len(HARD_THINGS) - len(THIN) + int(rng.integers(len(THIN)))
            mask = thin_mask(HARD_THINGS[thing], rng, img_size, cell)
            ink = colours(rng)[0]
            img[mask] = ink
        else:
            thing = int(rng.integers(len(HARD_THINGS) - len(THIN)))
            lo, hi = small if size_name == "small" else medium
            near = last if last is not None and rng.random() < 0.5 else None
            mask = _hard_object(rng, img, thing, int(rng.integers(lo, hi + 1)), near, detail)
        ys, xs = np.nonzero(mask)
        last = (int(xs.mean()), int(ys.mean())) if len(xs) else last
        labels[mask] = len(STUFF) + thing
        for earlier in instances:  # later objects occlude earlier ones
            earlier["mask"] &= ~mask
        instances.append({"category": thing, "mask": mask})
    instances = [i for i in instances if i["mask"].any()]
    img += rng.normal(0, 0.03, img.shape)
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8), labels, instances


def scene_renderer(difficulty: str) -> tuple[Callable[..., Scene], tuple[str, ...]]:
    """The scene renderer and thing classes of ``difficulty`` (``default``: the twins' scenes)."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty={difficulty!r}: expected one of {DIFFICULTIES}")
    return (render_scene, THINGS) if difficulty == "default" else (render_hard_scene, HARD_THINGS)


def generate_ade20k(
    out: str | Path,
    img_size: int = 128,
    train: int = 400,
    val: int = 100,
    seed: int = 0,
    difficulty: str = "default",
) -> Path:
    """Write an ADE20K-layout dataset: ``images/{training,validation}/*.jpg`` and index PNGs (0 = unlabelled);
    ``difficulty="hard"``: `render_hard_scene`'s scenes, whose thin classes ``splitlab_dataset.json`` names."""
    check_img_size(img_size)
    render, things = scene_renderer(difficulty)
    out = Path(out)
    rng = np.random.default_rng(seed)
    for split, count in (("training", train), ("validation", val)):
        (out / "images" / split).mkdir(parents=True, exist_ok=True)
        (out / "annotations" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            img, labels, _ = render(rng, img_size)
            name = f"ADE_{split[0]}_{i:06d}"
            Image.fromarray(img).save(out / "images" / split / f"{name}.png")
            Image.fromarray((labels + 1).astype(np.uint8)).save(out / "annotations" / split / f"{name}.png")
    classes = [*STUFF, *things]
    meta = {
        "generator": "splitlab data ade20k",
        "classes": classes,
        "num_classes": len(classes),
        "background_classes": [0, 1],
        "img_size": img_size,
        "seed": seed,
    }
    if difficulty != "default":  # the default twins' file stays as it was
        meta.update(difficulty=difficulty, thin_classes=[classes.index(t) for t in THIN])
    (out / "splitlab_dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def generate_coco(
    out: str | Path,
    img_size: int = 128,
    train: int = 400,
    val: int = 100,
    seed: int = 0,
    difficulty: str = "default",
) -> Path:
    """Write a COCO-format detection set: ``{train,val}2017/*.png`` and ``annotations/instances_*.json`` (RLE
    masks); ``difficulty="hard"``: `render_hard_scene`'s scenes, the thin classes' supercategory ``thin``."""
    from pycocotools import mask as mask_utils

    check_img_size(img_size)
    render, things = scene_renderer(difficulty)
    out = Path(out)
    rng = np.random.default_rng(seed)
    categories = [
        {"id": i + 1, "name": name, "supercategory": "thin" if name in THIN else "pattern"}
        for i, name in enumerate(things)
    ]
    for split, count in (("train2017", train), ("val2017", val)):
        (out / split).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for i in range(count):
            img, _, instances = render(rng, img_size)
            file_name = f"{i:012d}.png"
            Image.fromarray(img).save(out / split / file_name)
            image_id = i + 1
            images.append({"id": image_id, "file_name": file_name, "height": img_size, "width": img_size})
            for inst in instances:
                rle = mask_utils.encode(np.asfortranarray(inst["mask"].astype(np.uint8)))
                x, y, w, h = (float(v) for v in mask_utils.toBbox(rle))
                rle["counts"] = rle["counts"].decode("ascii")
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": image_id,
                        "category_id": inst["category"] + 1,
                        "bbox": [x, y, w, h],
                        "area": float(mask_utils.area(rle)),
                        "segmentation": rle,
                        "iscrowd": 0,
                    }
                )
        (out / "annotations").mkdir(parents=True, exist_ok=True)
        doc = {
            "images": images,
            "annotations": annotations,
            "categories": categories,
            "info": {"description": "splitlab data coco"},
        }
        (out / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    return out
