"""`generate_vqa`: small synthetic VQAv2 sets in the official layout (`splitlab.data.vqa`), to test on.

The scenes put 2-3 small coloured squares on a busy, high-entropy background. Each square is a
solid base colour (red, green, blue, yellow) with an inner 2 px pattern (horizontal stripes,
vertical stripes, checks) in a lighter and a darker shade of that colour, both equally far from
the base. Any 4x4 window of the pattern averages to the base colour, so "what color ..." questions
are answerable from coarse tokens while "what pattern ..." questions need fine tokens on that
square. The CI twin's variant (``patterned="one"``, higher contrast, two questions per scene) keeps
that property but drops the lookup among patterned squares, which a from-scratch 2-layer LM does
not learn in a CI budget (docs/vqa.md).

So that a regression does not pass on the one kind of scene it was built around, the object
``shape`` (`SHAPES`), the pattern set (`PATTERNS`: six, among them pairs that differ only in
orientation), the object count (``objects``) and the ``background`` are settings too; `SCENES`
names the configurations the regression trains and checks on. The defaults reproduce the
original scenes bit for bit (same seed, same files).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from splitlab.data.generators.shapes import draw_background, pattern_mask
from splitlab.data.vqa import (
    QUESTION_TYPES,
    SPECIAL_TOKENS,
    SPLITS,
    annotations_file,
    image_name,
    image_split,
    most_frequent,
    questions_file,
    vqa_words,
)
from splitlab.metrics.vqa import ANSWERS_PER_QUESTION, VQA_ANSWER_TYPES

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.8, 0.15, 0.15),
    "green": (0.15, 0.65, 0.2),
    "blue": (0.15, 0.3, 0.85),
    "yellow": (0.85, 0.8, 0.15),
}
PATTERNS = {  # kind -> answer; half of every 4x4 window is light, so it averages out
    "hstripes": "horizontal",
    "vstripes": "vertical",
    "checks": "checks",
    "rising": "rising",  # diagonal stripes "/" (rising and falling differ only in orientation)
    "falling": "falling",  # diagonal stripes "\\"
    "zigzag": "zigzag",  # vertical stripes whose rows shift 0, 1, 2, 1 px
}
DEFAULT_PATTERNS = ("hstripes", "vstripes", "checks")
SHAPES = ("square", "circle", "triangle", "diamond")
BACKGROUNDS = ("busy", "flat", "noise")
SHADE = 0.15  # light = base + SHADE, dark = base - SHADE: the pattern averages to the base colour
DETAIL = 2  # pattern feature width in px: a 4x downsample averages it away
PLACES = {  # descriptor -> (axis of the square's centre, extreme is the max)
    "on the left": (0, False),
    "on the right": (0, True),
    "at the top": (1, False),
    "at the bottom": (1, True),
}
SYNONYMS = {
    "horizontal": ("horizontal stripes", "stripes"),
    "vertical": ("vertical stripes", "stripes"),
    "checks": ("checkered", "checkerboard"),
    "rising": ("rising stripes", "diagonal"),
    "falling": ("falling stripes", "diagonal"),
    "zigzag": ("zig zag", "zigzags"),
    "red": ("dark red",),
    "green": ("light green",),
    "blue": ("light blue",),
    "yellow": ("gold",),
    "yes": ("yes!",),
    "no": ("nope",),
    "1": ("one",),
    "2": ("two",),
    "3": ("three",),
    "4": ("four",),
}


# What every named configuration shares: the twin's size, contrast, one patterned object per scene
# and two questions per image (the pattern one and one coarse one)
_SCENE_BASE: dict[str, Any] = {
    "img_size": 64,
    "train": 1200,
    "val": 450,
    "shade": 0.35,
    "patterned": "one",
    "questions_per_scene": 2,
}
SCENES: dict[str, dict[str, Any]] = {  # named configurations: generate_vqa's settings
    # the CI twin's data (`splitlab demo --task vqa`): squares, 3 patterns, 2-3 objects, busy background
    "twin": {**_SCENE_BASE, "square": (0.19, 0.25)},
    # scenes the twin was not built around (docs/vqa.md): other shapes, five or six patterns with
    # orientation-only pairs, more objects, other backgrounds
    "circles": {
        **_SCENE_BASE,
        "square": (0.22, 0.28),
        "shape": "circle",
        "patterns": ("hstripes", "vstripes", "rising", "falling", "checks"),
        "objects": (3, 4),
        "background": "flat",
    },
    "triangles": {
        **_SCENE_BASE,
        "square": (0.25, 0.31),
        "shape": "triangle",
        "patterns": ("rising", "falling", "zigzag", "vstripes", "hstripes", "checks"),
        "objects": (2, 4),
        "background": "noise",
    },
    "diamonds": {
        **_SCENE_BASE,
        "square": (0.25, 0.31),
        "shape": "diamond",
        "patterns": ("zigzag", "vstripes", "hstripes", "rising", "falling"),
        "objects": (2, 4),
        "background": "busy",
    },
}


def fine_pattern(kind: str, side: int, detail: int = DETAIL) -> np.ndarray:
    """``(side, side)`` bool mask of pattern ``kind`` (a key of `PATTERNS`), features ``detail`` px wide.

    The diagonal and zigzag kinds shift a vertical stripe pattern row by row, so every row (and
    with it every ``2 * detail`` window) is half light: the colour stays readable from coarse tokens.
    """
    if kind in ("hstripes", "vstripes", "checks"):
        return pattern_mask(kind, side, detail)
    ys, xs = np.mgrid[0:side, 0:side]
    if kind == "rising":
        shift = ys
    elif kind == "falling":
        shift = -ys
    elif kind == "zigzag":
        shift = detail - np.abs(ys % (2 * detail) - detail)
    else:
        raise ValueError(f"pattern {kind!r}: expected one of {', '.join(PATTERNS)}")
    return ((xs + shift) // detail) % 2 == 0


def shape_mask(shape: str, side: int) -> np.ndarray:
    """``(side, side)`` bool mask of an object of ``shape`` (one of `SHAPES`) filling its box."""
    if shape == "square":
        return np.ones((side, side), dtype=bool)
    c = np.arange(side) + 0.5 - side / 2  # pixel centres relative to the box centre
    ys, xs = np.meshgrid(c, c, indexing="ij")
    if shape == "circle":
        return xs**2 + ys**2 <= (side / 2) ** 2
    if shape == "diamond":
        return np.abs(xs) + np.abs(ys) <= side / 2
    if shape == "triangle":  # apex up, base along the bottom edge
        return np.abs(xs) <= (ys + side / 2) / 2
    raise ValueError(f"shape={shape!r}: expected one of {', '.join(SHAPES)}")


def _background(rng: np.random.Generator, img_size: int, kind: str) -> np.ndarray:
    """``busy``: blocky colour noise at 2-8 px plus pixel noise (`draw_background`); ``flat``: one plain
    colour; ``noise``: grey with strong per-pixel noise, fine detail everywhere but on the objects."""
    if kind in ("busy", "flat"):
        return draw_background(rng, img_size, kind)
    if kind == "noise":
        grey = rng.uniform(0.3, 0.7)
        return np.clip(grey + rng.normal(0.0, 0.2, (img_size, img_size, 3)), 0.0, 1.0).astype(np.float32)
    raise ValueError(f"background={kind!r}: expected one of {', '.join(BACKGROUNDS)}")


def render_vqa_scene(
    rng: np.random.Generator,
    img_size: int = 128,
    max_tries: int = 200,
    square: tuple[float, float] = (1 / 8, 1 / 5),
    shade: float = SHADE,
    patterned: str = "each",
    shape: str = "square",
    patterns: tuple[str, ...] = DEFAULT_PATTERNS,
    objects: tuple[int, int] = (2, 3),
    background: str = "busy",
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One scene: a ``uint8`` (img_size, img_size, 3) image and its objects.

    Objects are ``{"colour", "pattern" (a `PATTERNS` kind), "shape", "box": (x0, y0, x1, y1), "inner":
    box of the patterned region}``: ``objects`` (LO, HI) of them, distinct colours, 2 px apart at
    least, and laid out so that at least one of `PLACES` ("on the left", ...) names exactly one.
    ``square`` is their side range as fractions of ``img_size``; each is a ``shape`` of its base colour
    whose inner part (the same shape, a border smaller) carries the pattern. ``shade`` is the
    pattern's contrast (light and dark = base ± shade). ``patterned``: ``each`` object has its own
    pattern, drawn from ``patterns``, or only ``one`` has one and the others are plain
    (``"pattern": None``; see `generate_vqa`).
    """
    if patterned not in ("each", "one"):
        raise ValueError(f"patterned={patterned!r}: expected 'each' or 'one'")
    if not 0 < shade < 0.5:
        raise ValueError(f"shade={shade}: the pattern's contrast must lie in (0, 0.5)")
    lo, hi = max(int(img_size * square[0]), 6), max(int(img_size * square[1]), 6)
    for _ in range(max_tries):
        count = int(rng.integers(objects[0], objects[1] + 1))
        squares: list[dict[str, Any]] = []
        for _ in range(max_tries):
            side = int(rng.integers(lo, hi + 1))
            x0, y0 = (int(v) for v in rng.integers(0, img_size - side + 1, size=2))
            box = (x0, y0, x0 + side, y0 + side)
            if all(_apart(box, s["box"], 2) for s in squares):
                squares.append({"box": box})
                if len(squares) == count:
                    break
        if len(squares) == count and _places(squares):
            break
    else:
        raise RuntimeError(
            f"img_size={img_size}: could not lay out {objects[1]} objects; use a larger img_size, "
            "smaller objects (square) or fewer (objects)"
        )
    img = _background(rng, img_size, background)
    names = list(COLOURS)
    chosen = int(rng.integers(count)) if patterned == "one" else None
    for i, (square, c) in enumerate(zip(squares, rng.permutation(len(names))[:count], strict=True)):
        colour, pattern = names[int(c)], patterns[int(rng.integers(len(patterns)))]
        base = np.clip(np.array(COLOURS[colour]) + rng.uniform(-0.05, 0.05, 3), shade, 1 - shade)
        x0, y0, x1, y1 = square["box"]
        border = max(1, (x1 - x0) // 8)
        inner = (x0 + border, y0 + border, x1 - border, y1 - border)
        outline = shape_mask(shape, x1 - x0)[..., None]
        img[y0:y1, x0:x1] = np.where(outline, base, img[y0:y1, x0:x1])
        if chosen is not None and i != chosen:
            square.update(colour=colour, pattern=None, shape=shape, inner=inner)
            continue
        light, dark = base + shade, base - shade
        if rng.random() < 0.5:
            light, dark = dark, light
        mask = fine_pattern(pattern, inner[2] - inner[0], DETAIL)[..., None]
        region = img[inner[1] : inner[3], inner[0] : inner[2]]
        inside = shape_mask(shape, inner[2] - inner[0])[..., None]
        img[inner[1] : inner[3], inner[0] : inner[2]] = np.where(inside, np.where(mask, light, dark), region)
        square.update(colour=colour, pattern=pattern, shape=shape, inner=inner)
    return (img * 255).round().astype(np.uint8), squares


def _apart(a: tuple[int, ...], b: tuple[int, ...], gap: int) -> bool:
    """Boxes ``a`` and ``b`` (xyxy) are at least ``gap`` px apart along some axis."""
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _places(squares: list[dict[str, Any]]) -> dict[str, int]:
    """Descriptor -> index of the one square it names, for the descriptors that name one clearly (its
    centre at least half the smallest side beyond the next square's)."""
    margin = max(1.0, min(s["box"][2] - s["box"][0] for s in squares) / 2)
    found = {}
    for where, (axis, biggest) in PLACES.items():
        centres = [(s["box"][axis] + s["box"][axis + 2]) / 2 for s in squares]
        order = sorted(range(len(squares)), key=lambda i: centres[i], reverse=biggest)
        if abs(centres[order[0]] - centres[order[1]]) >= margin:
            found[where] = order[0]
    return found


def _questions(
    rng: np.random.Generator, squares: list[dict[str, Any]], count: int | None = None
) -> list[tuple[str, str, str, str]]:
    """``count`` (default 3-4) ``(question, right answer, question_type, answer_type)`` about one scene.

    Every scene gets a "what pattern" question (fine tokens on one object). By default a "what color"
    question (coarse tokens suffice) follows, then "is there" and/or "how many"; with ``count``, the
    pattern question and ``count - 1`` of those three, drawn at random. Objects are named by their
    shape ("the red circle"), the same for every object of a scene.
    """
    noun = squares[0].get("shape", "square")
    patterned = [s for s in squares if s["pattern"] is not None]
    target = patterned[int(rng.integers(len(patterned)))]
    out = [
        (
            f"what pattern is inside the {target['colour']} {noun}?",
            PATTERNS[target["pattern"]],
            "what pattern",
            "other",
        )
    ]
    places = _places(squares)
    where = sorted(places)[int(rng.integers(len(places)))]
    out.append(
        (f"what color is the {noun} {where}?", squares[places[where]]["colour"], "what color", "other")
    )
    present = {s["colour"] for s in squares}
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    if rng.random() < 0.5:  # half the "is there" questions are about a colour that is there
        colour = sorted(present)[int(rng.integers(len(present)))]
    extra = [
        (f"is there a {colour} {noun}?", "yes" if colour in present else "no", "is there", "yes/no"),
        (f"how many {noun}s are there?", str(len(squares)), "how many", "number"),
    ]
    if count is not None:
        coarse = out[1:] + extra
        keep = sorted(rng.choice(len(coarse), size=count - 1, replace=False).tolist())
        return out[:1] + [coarse[i] for i in keep]
    if rng.random() < 0.5:  # three questions: drop one of the two extras
        extra.pop(int(rng.integers(2)))
    return out + extra


def _wrong_answers(answer: str, answer_type: str, patterns: tuple[str, ...] = DEFAULT_PATTERNS) -> list[str]:
    """Plausible wrong answers of the same kind (for a pattern: the other patterns of the set)."""
    if answer_type == "yes/no":
        pool = ["yes", "no"]
    elif answer_type == "number":
        pool = ["1", "2", "3", "4"]
    elif answer in COLOURS:
        pool = list(COLOURS)
    else:
        pool = [PATTERNS[p] for p in patterns]
    return [a for a in pool if a != answer]


def _answers(
    rng: np.random.Generator, answer: str, answer_type: str, patterns: tuple[str, ...] = DEFAULT_PATTERNS
) -> list[dict[str, Any]]:
    """Ten annotators' answers: mostly ``answer``, sometimes a synonym (a different exact string, which
    the official metric counts apart), sometimes wrong; ``answer`` is always the most frequent."""
    synonyms, wrong = SYNONYMS.get(answer, ()), _wrong_answers(answer, answer_type, patterns)
    while True:
        picks = []
        for _ in range(ANSWERS_PER_QUESTION):
            u = rng.random()
            if u < 0.75 or (u < 0.9 and not synonyms):
                picks.append((answer, "yes" if rng.random() < 0.9 else "maybe"))
            elif u < 0.9:
                picks.append(
                    (synonyms[int(rng.integers(len(synonyms)))], "yes" if rng.random() < 0.7 else "maybe")
                )
            else:
                picks.append(
                    (wrong[int(rng.integers(len(wrong)))], ("maybe", "no", "yes")[int(rng.integers(3))])
                )
        counts = Counter(a for a, _ in picks).most_common()
        if counts[0][0] == answer and (len(counts) == 1 or counts[1][1] < counts[0][1]):
            break
    return [{"answer_id": i + 1, "answer": a, "answer_confidence": c} for i, (a, c) in enumerate(picks)]


def generate_vqa(
    out: str | Path,
    img_size: int = 128,
    train: int = 300,
    val: int = 80,
    seed: int = 0,
    fmt: str = "official",
    square: tuple[float, float] = (1 / 8, 1 / 5),
    shade: float = SHADE,
    patterned: str = "each",
    questions_per_scene: int | None = None,
    shape: str = "square",
    patterns: tuple[str, ...] = DEFAULT_PATTERNS,
    objects: tuple[int, int] = (2, 3),
    background: str = "busy",
) -> Path:
    """Write a synthetic VQAv2 set (see the module docstring) and ``vocab.json``.

    Args:
        out: output directory.
        img_size: image side in pixels (at least 48, so that three squares fit).
        square: the squares' side range as fractions of ``img_size``.
        shade: the patterns' contrast (light and dark = base colour ± shade).
        patterned: ``each`` square has its own pattern, or only ``one`` has a pattern (the one the
            pattern question asks about) and the others are plain. With ``one``, "what pattern is
            inside the red square?" still needs fine tokens on that square but no lookup of the
            named one among patterned squares: the CI twin's from-scratch 2-layer LM learns that
            read-out in a few hundred steps, not the lookup (docs/vqa.md).
        questions_per_scene: 1-4: the pattern question and ``questions_per_scene - 1`` coarse
            ones; default 3-4 (pattern, colour, then "is there" and/or "how many").
        shape: every object's shape (`SHAPES`), which the questions name ("the red circle").
        patterns: the pattern set (2 or more `PATTERNS` kinds), each object's drawn from it:
            ``rising``/``falling`` and ``hstripes``/``vstripes`` differ only in orientation.
        objects: (LO, HI) objects per scene, 2 <= LO <= HI <= 4 (one colour each; "on the left"
            needs two to compare).
        background: ``busy`` (blocky colour noise: entropy points away from the objects), ``flat``
            (one colour: entropy is the right cue) or ``noise`` (per-pixel noise everywhere).
        train, val: images in ``train2014`` and ``val2014`` (3-4 questions each).
        seed: random seed (same seed, same files).
        fmt: ``official`` (the VQAv2 JSON files and ``{split}/COCO_{split}_*.png``; PNG so the 2 px
            patterns survive) or ``hf`` (a ``datasets.save_to_disk`` DatasetDict with splits
            ``train2014``/``val2014`` and one row per question, as HuggingFaceM4/VQAv2).

    ``vocab.json`` lists `SPECIAL_TOKENS` first, then every word of the questions and answers
    (`vqa_words`) sorted: the input of a word-level tokenizer.
    """
    if img_size < 48:
        raise ValueError(f"img_size={img_size}: use at least 48 px so that three squares fit")
    if not 0 < square[0] <= square[1] <= 0.5:
        raise ValueError(
            f"square={tuple(square)}: expected 0 < LO <= HI <= 0.5 (sides as fractions of the image)"
        )
    if questions_per_scene is not None and not 1 <= questions_per_scene <= 4:
        raise ValueError(
            f"questions_per_scene={questions_per_scene}: a scene has 1-4 questions (the pattern one first)"
        )
    if fmt not in ("official", "hf"):
        raise ValueError(f"format={fmt!r}: expected 'official' or 'hf'")
    if shape not in SHAPES:
        raise ValueError(f"shape={shape!r}: expected one of {', '.join(SHAPES)}")
    patterns = tuple(patterns)
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown or len(set(patterns)) != len(patterns) or len(patterns) < 2:
        raise ValueError(f"patterns={patterns}: expected 2 or more distinct kinds of {', '.join(PATTERNS)}")
    objects = (int(objects[0]), int(objects[1]))
    if not 2 <= objects[0] <= objects[1] <= len(COLOURS):
        raise ValueError(
            f"objects={objects}: expected 2 <= LO <= HI <= {len(COLOURS)} (one colour per object)"
        )
    if background not in BACKGROUNDS:
        raise ValueError(f"background={background!r}: expected one of {', '.join(BACKGROUNDS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words: set[str] = set()
    first_id = 1
    hf_parts = {}
    for split, count in zip(SPLITS, (train, val), strict=True):
        questions, annotations, images = [], [], {}
        for i in range(count):
            image_id = first_id + i  # unique across splits, as COCO's ids are
            img, squares = render_vqa_scene(
                rng,
                img_size,
                square=square,
                shade=shade,
                patterned=patterned,
                shape=shape,
                patterns=patterns,
                objects=objects,
                background=background,
            )
            images[image_id] = img
            for k, (question, answer, question_type, answer_type) in enumerate(
                _questions(rng, squares, questions_per_scene)
            ):
                question_id = image_id * 1000 + k  # the official scheme
                answers = _answers(rng, answer, answer_type, patterns)
                questions.append({"image_id": image_id, "question": question, "question_id": question_id})
                annotations.append(
                    {
                        "question_id": question_id,
                        "image_id": image_id,
                        "question_type": question_type,
                        "answer_type": answer_type,
                        "multiple_choice_answer": most_frequent([a["answer"] for a in answers]),
                        "answers": answers,
                    }
                )
                words.update(vqa_words(question))
                for a in answers:
                    words.update(vqa_words(a["answer"]))
        first_id += count
        if fmt == "official":
            _write_official(out, split, questions, annotations, images, seed)
        else:
            hf_parts[split] = _hf_split(questions, annotations, images)
    if fmt == "hf":
        import datasets

        datasets.DatasetDict(hf_parts).save_to_disk(str(out))
    vocab = [*SPECIAL_TOKENS, *sorted(words - set(SPECIAL_TOKENS))]
    (out / "vocab.json").write_text(json.dumps(vocab, indent=1) + "\n")
    meta = {
        "generator": "splitlab data vqa",
        "format": fmt,
        "splits": dict(zip(SPLITS, (train, val), strict=True)),
        "img_size": img_size,
        "seed": seed,
        "colours": list(COLOURS),
        "patterns": [PATTERNS[p] for p in patterns],
        "shape": shape,
        "objects": list(objects),
        "background": background,
        "question_types": list(QUESTION_TYPES),
        "answer_types": list(VQA_ANSWER_TYPES),
        "detail": DETAIL,
        "shade": shade,
        "patterned": patterned,
        "questions_per_scene": questions_per_scene or "3-4",
        "vocab": "vocab.json",
    }
    (out / "splitlab_dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def _info(seed: int) -> dict[str, Any]:
    return {
        "description": "splitlab data vqa: synthetic scenes in the VQA v2.0 layout",
        "version": "2.0",
        "contributor": "splitlab",
        "seed": seed,
    }


def _write_official(
    out: Path,
    split: str,
    questions: list[dict],
    annotations: list[dict],
    images: dict[int, np.ndarray],
    seed: int,
) -> None:
    folder = out / image_split(split)
    folder.mkdir(parents=True, exist_ok=True)
    for image_id, img in images.items():
        Image.fromarray(img).save(folder / image_name(split, image_id, ".png"))
    license_ = {"name": "synthetic, generated by splitlab", "url": ""}
    questions_doc = {
        "info": _info(seed),
        "task_type": "Open-Ended",
        "data_type": "mscoco",
        "license": license_,
        "data_subtype": split,
        "questions": questions,
    }
    annotations_doc = {
        "info": _info(seed),
        "license": license_,
        "data_type": "mscoco",
        "data_subtype": split,
        "annotations": annotations,
    }
    questions_file(out, split).write_text(json.dumps(questions_doc))
    annotations_file(out, split).write_text(json.dumps(annotations_doc))


def _hf_split(questions: list[dict], annotations: list[dict], images: dict[int, np.ndarray]) -> Any:
    """One row per question, the columns and answer structs of HuggingFaceM4/VQAv2."""
    import datasets

    answer = {
        "answer": datasets.Value("string"),
        "answer_confidence": datasets.Value("string"),
        "answer_id": datasets.Value("int64"),
    }
    features = datasets.Features(
        {
            "question_type": datasets.Value("string"),
            "multiple_choice_answer": datasets.Value("string"),
            "answers": [answer],
            "image_id": datasets.Value("int64"),
            "answer_type": datasets.Value("string"),
            "question_id": datasets.Value("int64"),
            "question": datasets.Value("string"),
            "image": datasets.Image(),
        }
    )
    rows: dict[str, list] = {name: [] for name in features}
    for q, a in zip(questions, annotations, strict=True):
        for key in ("question_type", "multiple_choice_answer", "answers", "answer_type"):
            rows[key].append(a[key])
        for key in ("image_id", "question_id", "question"):
            rows[key].append(q[key])
        rows["image"].append(Image.fromarray(images[q["image_id"]]))
    return datasets.Dataset.from_dict(rows, features=features)
