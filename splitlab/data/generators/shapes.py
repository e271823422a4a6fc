"""A small classification set where token allocation matters: the class lives in fine detail.

Each image is one small square on a busy, high-entropy background. The class is the square's
inner pattern (horizontal stripes, vertical stripes, checks or dots, 1-2 px features): a coarse
token downsamples it to flat colour, so only fine tokens *on the object* keep the class. Pixel
entropy is a poor guide here (the background has more of it than the two-colour object), and
random splits find the object only by chance. All four classes survive horizontal flips.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from splitlab.data.generators import hard_scenes as hs

CLASSES = ("hstripes", "vstripes", "checks", "dots")
# difficulty="hard": two more classes whose fill is flat and whose outline (solid, dashed) is the class
HARD_CLASSES = (*CLASSES, "framed", "dashed")
SPLITS = ("train", "val", "test")
DIFFICULTIES = ("default", "hard")


BACKGROUNDS = ("busy", "flat")


def draw_background(rng: np.random.Generator, img_size: int, kind: str = "busy") -> np.ndarray:
    """``busy``: blocky colour noise at several scales plus pixel noise (pixel entropy points away
    from the object). ``flat``: one plain colour per image, so the object is the only busy region
    and pixel entropy is the right cue."""
    if kind == "flat":
        return np.broadcast_to(rng.random(3, dtype=np.float32) * 0.6 + 0.2, (img_size, img_size, 3)).copy()
    img = np.zeros((img_size, img_size, 3), dtype=np.float32)
    for cell in (2, 4, 8):
        n = img_size // cell
        blocks = rng.random((n, n, 3), dtype=np.float32)
        img += np.kron(blocks, np.ones((cell, cell, 1), dtype=np.float32))
    img = img / 3.0 + rng.normal(0.0, 0.08, (img_size, img_size, 3)).astype(np.float32)
    return np.clip(img, 0.0, 1.0)


def pattern_mask(kind: str, side: int, detail: int = 2) -> np.ndarray:
    """``(side, side)`` bool mask of the pattern's foreground; features are ``detail`` px wide."""
    ys, xs = np.mgrid[0:side, 0:side] // detail
    if kind == "hstripes":
        return ys % 2 == 0
    if kind == "vstripes":
        return xs % 2 == 0
    if kind == "checks":
        return (ys + xs) % 2 == 0
    if kind == "dots":
        return (ys % 2 == 0) & (xs % 2 == 0)  # a dot every other feature, both ways
    raise ValueError(f"unknown pattern {kind!r}")


def render(
    kind: str,
    rng: np.random.Generator,
    img_size: int = 64,
    object_size: tuple[int, int] = (16, 24),
    detail: int = 2,
    background: str = "busy",
) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """One image of class ``kind`` and the object's box ``(x0, y0, x1, y1)``."""
    img = draw_background(rng, img_size, background)
    side = int(rng.integers(object_size[0], object_size[1] + 1))
    x0, y0 = (int(v) for v in rng.integers(0, img_size - side + 1, size=2))
    dark = rng.random(3) * 0.3
    light = 0.7 + rng.random(3) * 0.3
    if rng.random() < 0.5:
        dark, light = light, dark
    mask = pattern_mask(kind, side, detail)[..., None]
    img[y0 : y0 + side, x0 : x0 + side] = np.where(mask, light, dark)
    return (img * 255).round().astype(np.uint8), (x0, y0, x0 + side, y0 + side)


def render_hard(
    kind: str,
    rng: np.random.Generator,
    img_size: int,
    object_size: tuple[int, int],
    detail: int = 2,
    cell: int = 8,
) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """One hard image of class ``kind`` (`HARD_CLASSES`) and its box: the object on a natural texture
    among distractors that are not the class (a large flat blob, smaller flat squares, thin lines and a
    lattice 1-3 finest cells of ``cell`` px wide), one thin line at times across the object."""
    img = hs.natural_texture(rng, img_size)
    side = int(rng.integers(img_size // 2, img_size * 3 // 4 + 1))  # larger than half the image
    x0, y0 = hs.place(rng, img_size, side)
    img[y0 : y0 + side, x0 : x0 + side] = 0.5 * img[y0 : y0 + side, x0 : x0 + side] + 0.5 * hs.colours(rng)[0]
    for _ in range(int(rng.integers(1, 4))):
        size = int(rng.integers(object_size[0], object_size[1] + 1))
        x0, y0 = hs.place(rng, img_size, size)
        img[y0 : y0 + size, x0 : x0 + size] = hs.colours(rng)[0]
    for thin in ("line", "grid")[: int(rng.integers(1, 3))]:
        img[hs.thin_mask(thin, rng, img_size, cell)] = hs.colours(rng)[0]
    side = int(rng.integers(object_size[0], object_size[1] + 1))
    x0, y0 = hs.place(rng, img_size, side)
    if kind in hs.OUTLINED:
        fill, ink = hs.colours(rng)
        img[y0 : y0 + side, x0 : x0 + side] = hs.outlined_object(kind, rng, side, fill, ink)
    else:
        a, b = hs.colours(rng)
        img[y0 : y0 + side, x0 : x0 + side] = np.where(pattern_mask(kind, side, detail)[..., None], b, a)
    if rng.random() < 0.3:  # a wire in front of the object
        img[hs.thin_mask("line", rng, img_size, cell)] = hs.colours(rng)[0]
    img = np.clip(img + rng.normal(0, 0.03, img.shape), 0.0, 1.0)
    return (img * 255).round().astype(np.uint8), (x0, y0, x0 + side, y0 + side)


def check_img_size(img_size: int) -> None:
    """Generated images need room for their objects (shapes, COCO and ADE20K scenes alike)."""
    if img_size < 32:
        raise ValueError(f"img_size={img_size}: use at least 32 px so the objects fit")


def generate_shapes(
    out: str | Path,
    img_size: int = 64,
    train: int = 600,
    val: int = 150,
    test: int = 150,
    seed: int = 0,
    fmt: str = "imagefolder",
    detail: int = 2,
    background: str = "busy",
    difficulty: str = "default",
) -> Path:
    """Write the dataset (counts are per class).

    Args:
        out: output directory.
        img_size: image side in pixels.
        train, val, test: images per class and split.
        seed: random seed (same seed, same files).
        fmt: ``imagefolder`` (``out/<split>/<class>/*.png``) or ``hf`` (``datasets.save_to_disk``).
        detail: width in pixels of the pattern's stripes, checks and dots. At 2 px the 4x
            downsampling of a coarse token averages them to flat colour. (At 1 px the finest patch
            embeddings differ so strongly that the children projection carries the class into
            coarse tokens, and every layout does well: measured random 93-97%, entropy 85%.)
        background: ``busy`` (default: pixel entropy is a poor guide) or ``flat`` (entropy is the
            right cue: the control on which a learned policy must at least match APT).
        difficulty: ``default`` or ``hard`` (`render_hard`: the classes of `HARD_CLASSES`, smaller
            objects on a natural texture among distractors; ``background`` does not apply).

    Besides the images, ``objects.json`` holds each object's box ``[x0, y0, x1, y1]`` per split,
    keyed by the image's path under ``out`` (or by its index in the split, for ``hf``).
    """
    check_img_size(img_size)
    if fmt not in ("imagefolder", "hf"):
        raise ValueError(f"format={fmt!r}: expected 'imagefolder' or 'hf'")
    if background not in BACKGROUNDS:
        raise ValueError(f"background={background!r}: expected one of {BACKGROUNDS}")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty={difficulty!r}: expected one of {DIFFICULTIES}")
    hard = difficulty == "hard"
    classes = HARD_CLASSES if hard else CLASSES
    out = Path(out)
    rng = np.random.default_rng(seed)
    object_size = (img_size // 8 + 2, img_size // 4) if hard else (img_size * 3 // 16, img_size * 5 // 16)
    counts = {"train": train, "val": val, "test": test}
    records: dict[str, list[tuple[np.ndarray, int]]] = {s: [] for s in SPLITS}
    boxes: dict[str, list[tuple[int, int, int, int]]] = {s: [] for s in SPLITS}
    for split in SPLITS:
        for label, kind in enumerate(classes):
            for _ in range(counts[split]):
                if hard:
                    img, box = render_hard(kind, rng, img_size, object_size, detail)
                else:
                    img, box = render(kind, rng, img_size, object_size, detail, background)
                records[split].append((img, label))
                boxes[split].append(box)
    # where each object is, for analyses of where a policy put its tokens (scripts/object_misses.py)
    objects: dict[str, dict[str, list[int]]] = {s: {} for s in SPLITS}
    if fmt == "imagefolder":
        for split, items in records.items():
            for i, (img, label) in enumerate(items):
                name = f"{split}/{classes[label]}/{split}_{i:05d}.png"
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(img).save(out / name)
                objects[split][name] = list(boxes[split][i])
    else:
        import datasets

        features = datasets.Features(
            {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(classes))}
        )
        parts = {
            ("validation" if split == "val" else split): datasets.Dataset.from_dict(
                {"image": [Image.fromarray(img) for img, _ in items], "label": [lab for _, lab in items]},
                features=features,
            )
            for split, items in records.items()
        }
        datasets.DatasetDict(parts).save_to_disk(str(out))
        objects = {split: {str(i): list(box) for i, box in enumerate(b)} for split, b in boxes.items()}
    (out / "objects.json").write_text(json.dumps(objects) + "\n")
    meta = {
        "generator": "splitlab data shapes",
        "classes": list(classes),
        "img_size": img_size,
        "per_class": counts,
        "seed": seed,
        "format": fmt,
        "detail": detail,
        "background": background,
    }
    if hard:  # the default set's file stays as it was
        meta["difficulty"] = difficulty
    (out / "splitlab_dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out
