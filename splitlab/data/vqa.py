"""VQAv2: `VQAv2Data` reads the official files (or a Hugging Face dataset); `generate_vqa` writes a small
synthetic set in the same layout.

The official layout, per split (``train2014``, ``val2014``)::

    v2_OpenEnded_mscoco_{split}_questions.json   {"questions": [{"image_id", "question", "question_id"}]}
    v2_mscoco_{split}_annotations.json           {"annotations": [{"question_id", "image_id", "answers": [10 x
                                                  {"answer", ...}], "answer_type", "question_type",
                                                  "multiple_choice_answer"}]}
    {split}/COCO_{split}_{image_id:012d}.jpg

One dataset item is one image with *all* its questions, so the vision model (the expensive,
token-allocating part) runs once per image however many questions it has.

The synthetic scenes put 2-3 small coloured squares on a busy, high-entropy background. Each
square is a solid base colour (red, green, blue, yellow) with an inner 2 px pattern (horizontal
stripes, vertical stripes, checks) in a lighter and a darker shade of that colour, both equally
far from the base. Any 4x4 window of the pattern averages to the base colour, so "what color ..."
questions are answerable from coarse tokens while "what pattern ..." questions need fine tokens
on that square.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from splitlab.data.common import PadTo, SkipCorrupt, SplitDataModule, require_dir
from splitlab.data.shapes import _background, pattern_mask

# OpenAI CLIP's normalisation (the usual VQA vision towers: CLIP / SigLIP-style ViTs at 336 px)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

SPLITS = ("train2014", "val2014")
ANSWER_TYPES = ("yes/no", "number", "other")
QUESTION_TYPES = ("what pattern", "what color", "is there", "how many")
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<image>")
ANSWERS_PER_QUESTION = 10

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.8, 0.15, 0.15),
    "green": (0.15, 0.65, 0.2),
    "blue": (0.15, 0.3, 0.85),
    "yellow": (0.85, 0.8, 0.15),
}
PATTERNS = {
    "hstripes": "horizontal",
    "vstripes": "vertical",
    "checks": "checks",
}  # pattern_mask kind -> answer
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


def questions_file(root: Path, split: str) -> Path:
    """The official questions file of ``split``."""
    return root / f"v2_OpenEnded_mscoco_{split}_questions.json"


def annotations_file(root: Path, split: str) -> Path:
    """The official annotations file of ``split``."""
    return root / f"v2_mscoco_{split}_annotations.json"


def image_name(split: str, image_id: int, suffix: str = ".jpg") -> str:
    """COCO's file name of ``image_id`` in ``split``."""
    return f"COCO_{split}_{image_id:012d}{suffix}"


def vqa_words(text: str) -> list[str]:
    """Lower-cased words with punctuation split off (the tokenisation behind ``vocab.json``)."""
    return re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())


# ---------------------------------------------------------------------------------------------
# generator


def render_vqa_scene(
    rng: np.random.Generator,
    size: int = 128,
    max_tries: int = 200,
    square: tuple[float, float] = (1 / 8, 1 / 5),
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One scene: a ``uint8`` (size, size, 3) image and its squares.

    Squares are ``{"colour", "pattern" (pattern_mask kind), "box": (x0, y0, x1, y1), "inner": box of
    the patterned region}``: 2-3 of them, distinct colours, 2 px apart at least, and laid out so that
    at least one of `PLACES` ("on the left", ...) names exactly one square.
    """
    lo, hi = max(int(size * square[0]), 6), max(int(size * square[1]), 6)
    for _ in range(max_tries):
        count = int(rng.integers(2, 4))
        squares: list[dict[str, Any]] = []
        for _ in range(max_tries):
            side = int(rng.integers(lo, hi + 1))
            x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
            box = (x0, y0, x0 + side, y0 + side)
            if all(_apart(box, s["box"], 2) for s in squares):
                squares.append({"box": box})
                if len(squares) == count:
                    break
        if len(squares) == count and _places(squares):
            break
    else:
        raise RuntimeError(f"image_size={size}: could not lay out the squares; use a larger image_size")
    img = _background(rng, size)
    names = list(COLOURS)
    for square, c in zip(squares, rng.permutation(len(names))[:count], strict=True):
        colour, pattern = names[int(c)], list(PATTERNS)[int(rng.integers(len(PATTERNS)))]
        base = np.clip(np.array(COLOURS[colour]) + rng.uniform(-0.05, 0.05, 3), SHADE, 1 - SHADE)
        x0, y0, x1, y1 = square["box"]
        border = max(1, (x1 - x0) // 8)
        inner = (x0 + border, y0 + border, x1 - border, y1 - border)
        img[y0:y1, x0:x1] = base
        light, dark = base + SHADE, base - SHADE
        if rng.random() < 0.5:
            light, dark = dark, light
        mask = pattern_mask(pattern, inner[2] - inner[0], DETAIL)[..., None]
        img[inner[1] : inner[3], inner[0] : inner[2]] = np.where(mask, light, dark)
        square.update(colour=colour, pattern=pattern, inner=inner)
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


def _questions(rng: np.random.Generator, squares: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """3-4 ``(question, right answer, question_type, answer_type)`` about one scene.

    Every scene gets a "what pattern" question (fine tokens on one square) and a "what color"
    question (coarse tokens suffice), then "is there" and/or "how many".
    """
    target = squares[int(rng.integers(len(squares)))]
    out = [
        (
            f"what pattern is inside the {target['colour']} square?",
            PATTERNS[target["pattern"]],
            "what pattern",
            "other",
        )
    ]
    places = _places(squares)
    where = sorted(places)[int(rng.integers(len(places)))]
    out.append(
        (f"what color is the square {where}?", squares[places[where]]["colour"], "what color", "other")
    )
    present = {s["colour"] for s in squares}
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    if rng.random() < 0.5:  # half the "is there" questions are about a colour that is there
        colour = sorted(present)[int(rng.integers(len(present)))]
    extra = [
        (f"is there a {colour} square?", "yes" if colour in present else "no", "is there", "yes/no"),
        ("how many squares are there?", str(len(squares)), "how many", "number"),
    ]
    if rng.random() < 0.5:  # three questions: drop one of the two extras
        extra.pop(int(rng.integers(2)))
    return out + extra


def _wrong_answers(answer: str, answer_type: str) -> list[str]:
    """Plausible wrong answers of the same kind."""
    if answer_type == "yes/no":
        pool = ["yes", "no"]
    elif answer_type == "number":
        pool = ["1", "2", "3", "4"]
    elif answer in COLOURS:
        pool = list(COLOURS)
    else:
        pool = list(PATTERNS.values())
    return [a for a in pool if a != answer]


def _answers(rng: np.random.Generator, answer: str, answer_type: str) -> list[dict[str, Any]]:
    """Ten annotators' answers: mostly ``answer``, sometimes a synonym (a different exact string, which
    the official metric counts apart), sometimes wrong; ``answer`` is always the most frequent."""
    synonyms, wrong = SYNONYMS.get(answer, ()), _wrong_answers(answer, answer_type)
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


def most_frequent(answers: Sequence[str]) -> str:
    """The most frequent answer (first given on ties), as VQAv2's ``multiple_choice_answer``."""
    return Counter(answers).most_common(1)[0][0]


def generate_vqa(
    out: str | Path,
    image_size: int = 128,
    train: int = 300,
    val: int = 80,
    seed: int = 0,
    fmt: str = "official",
    square: tuple[float, float] = (1 / 8, 1 / 5),
) -> Path:
    """Write a synthetic VQAv2 set (see the module docstring) and ``vocab.json``.

    Args:
        out: output directory.
        image_size: image side in pixels (at least 48, so that three squares fit).
        square: the squares' side range as fractions of ``image_size``.
        train, val: images in ``train2014`` and ``val2014`` (3-4 questions each).
        seed: random seed (same seed, same files).
        fmt: ``official`` (the VQAv2 JSON files and ``{split}/COCO_{split}_*.png``; PNG so the 2 px
            patterns survive) or ``hf`` (a ``datasets.save_to_disk`` DatasetDict with splits
            ``train2014``/``val2014`` and one row per question, as HuggingFaceM4/VQAv2).

    ``vocab.json`` lists `SPECIAL_TOKENS` first, then every word of the questions and answers
    (`vqa_words`) sorted: the input of a word-level tokenizer.
    """
    if image_size < 48:
        raise ValueError(f"image_size={image_size}: use at least 48 px so that three squares fit")
    if fmt not in ("official", "hf"):
        raise ValueError(f"format={fmt!r}: expected 'official' or 'hf'")
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
            img, squares = render_vqa_scene(rng, image_size, square=square)
            images[image_id] = img
            for k, (question, answer, question_type, answer_type) in enumerate(_questions(rng, squares)):
                question_id = image_id * 1000 + k  # the official scheme
                answers = _answers(rng, answer, answer_type)
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
        "image_size": image_size,
        "seed": seed,
        "colours": list(COLOURS),
        "patterns": list(PATTERNS.values()),
        "question_types": list(QUESTION_TYPES),
        "answer_types": list(ANSWER_TYPES),
        "detail": DETAIL,
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
    (out / split).mkdir(parents=True, exist_ok=True)
    for image_id, img in images.items():
        Image.fromarray(img).save(out / split / image_name(split, image_id, ".png"))
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


# ---------------------------------------------------------------------------------------------
# reading


def _read_json(path: Path, key: str, what: str) -> list[dict[str, Any]]:
    """``doc[key]`` of the JSON file at ``path``, with errors that name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such {what} file (VQAv2 layout: {path.name} in data.root)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise ValueError(f"{path}: expected a JSON object with a {key!r} list (the official {what} file)")
    return doc[key]


def _answer_strings(answers: Any) -> list[str]:
    """Answers given as strings, ``[{"answer": ...}]`` (official, HuggingFaceM4/VQAv2) or ``{"answer": [...]}``."""
    if isinstance(answers, dict):
        answers = answers.get("answer", [])
    return [a["answer"] if isinstance(a, dict) else a for a in answers]


def check_annotation(answers: list[str], answer_type: str, question_id: int, where: str) -> None:
    """Ten answers and a known answer type (checked before training; ``where`` names the file)."""
    if len(answers) != ANSWERS_PER_QUESTION:
        raise ValueError(
            f"{where}: question_id {question_id} has {len(answers)} answers; VQAv2 has "
            f"{ANSWERS_PER_QUESTION} per question (fix or remove the entry)"
        )
    if answer_type not in ANSWER_TYPES:
        raise ValueError(
            f"{where}: question_id {question_id} has answer_type {answer_type!r}; "
            f"expected one of {', '.join(repr(t) for t in ANSWER_TYPES)}"
        )


def _group(rows: list[dict[str, Any]], max_questions: int | None) -> list[dict[str, Any]]:
    """Rows (one per question, with ``image_id`` and ``source``) -> one item per image, sorted by id."""
    by_image: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_image.setdefault(int(row["image_id"]), []).append(row)
    items = []
    for image_id in sorted(by_image):
        group = sorted(by_image[image_id], key=lambda r: r["question_id"])[:max_questions]
        items.append(
            {
                "source": group[0]["source"],
                "target": {
                    "image_id": image_id,
                    "question_ids": [int(r["question_id"]) for r in group],
                    "questions": [r["question"] for r in group],
                    "answers": [r["answers"] for r in group],
                    "answer_types": [r["answer_type"] for r in group],
                    "question_types": [r["question_type"] for r in group],
                    "multiple_choice_answers": [r["multiple_choice_answer"] for r in group],
                },
            }
        )
    return items


def load_vqa(root: Path, split: str, max_questions: int | None = None) -> list[dict[str, Any]]:
    """Read and check one split of the official files: one item per image, ``{"source": image path,
    "target": the target dict}``.

    Checks (each error names the file): both files exist; every question has an annotation with
    10 answers and a known answer type; questions and annotations agree on the image; every
    image exists as ``{split}/COCO_{split}_{id:012d}.jpg`` or ``.png``.
    """
    q_path, a_path = questions_file(root, split), annotations_file(root, split)
    questions = _read_json(q_path, "questions", "questions")
    annotations = {a["question_id"]: a for a in _read_json(a_path, "annotations", "annotations")}
    orphans = [q["question_id"] for q in questions if q["question_id"] not in annotations]
    if orphans:
        raise ValueError(
            f"{a_path}: no annotation for {len(orphans)} question(s), e.g. question_id {orphans[0]} "
            f"(of {q_path.name})"
        )
    for qid, ann in annotations.items():
        ann["answers"] = _answer_strings(ann.get("answers", []))
        check_annotation(ann["answers"], ann.get("answer_type"), qid, str(a_path))
    for q in questions:
        if q["image_id"] != annotations[q["question_id"]].get("image_id"):
            raise ValueError(
                f"{q_path} and {a_path} disagree on the image of question_id {q['question_id']}: "
                f"image_id {q['image_id']} vs {annotations[q['question_id']].get('image_id')}"
            )
    folder = root / split
    present = {entry.name for entry in os.scandir(folder)} if folder.is_dir() else set()
    files, missing = {}, []
    for image_id in sorted({q["image_id"] for q in questions}):
        name = next(
            (
                image_name(split, image_id, s)
                for s in (".jpg", ".png")
                if image_name(split, image_id, s) in present
            ),
            None,
        )
        if name is None:
            missing.append(image_name(split, image_id))
        files[image_id] = folder / (name or "")
    if missing:
        raise FileNotFoundError(
            f"{q_path} names {len(missing)} image(s) missing from {folder}, e.g. {missing[0]} (or .png)"
        )
    rows = []
    for q in questions:
        ann = annotations[q["question_id"]]
        rows.append(
            {
                "image_id": q["image_id"],
                "question_id": q["question_id"],
                "question": q["question"],
                "answers": ann["answers"],
                "answer_type": ann["answer_type"],
                "question_type": ann.get("question_type", ""),
                "multiple_choice_answer": ann.get("multiple_choice_answer") or most_frequent(ann["answers"]),
                "source": files[q["image_id"]],
            }
        )
    return _group(rows, max_questions)


HF_COLUMNS = ("image", "question", "question_id", "image_id", "answers", "answer_type")


def load_vqa_hf(split: Any, name: str, max_questions: int | None = None) -> list[dict[str, Any]]:
    """Items like `load_vqa` from a `datasets` split with one row per question (``source`` is the
    row holding the image). ``question_type`` and ``multiple_choice_answer`` are optional columns
    (empty, and the most frequent answer, when absent)."""
    missing = [c for c in HF_COLUMNS if c not in split.column_names]
    if missing:
        raise ValueError(
            f"{name}: no column {missing} (columns: {split.column_names}); VQA rows need {list(HF_COLUMNS)}"
        )
    wanted = [c for c in split.column_names if c != "image"]
    table = split.select_columns(wanted).to_dict()
    rows = []
    for index in range(len(split)):
        row = {c: table[c][index] for c in wanted}
        answers = _answer_strings(row["answers"])
        check_annotation(answers, row["answer_type"], row["question_id"], name)
        rows.append(
            {
                "image_id": int(row["image_id"]),
                "question_id": int(row["question_id"]),
                "question": row["question"],
                "answers": answers,
                "answer_type": row["answer_type"],
                "question_type": row.get("question_type") or "",
                "multiple_choice_answer": row.get("multiple_choice_answer") or most_frequent(answers),
                "source": index,
            }
        )
    return _group(rows, max_questions)


class VQAImages(Dataset):
    """``(image, target)`` per image: the image letterboxed and normalised, the target dict of all
    its questions (see `VQAv2Data`).

    Args:
        items: from `load_vqa` or `load_vqa_hf`.
        transform: PIL image -> tensor.
        images: for Hugging Face items, the split's ``image`` column (``source`` is a row).
    """

    def __init__(self, items: list[dict[str, Any]], transform: Any, images: Any = None) -> None:
        self.items, self.transform, self.images = items, transform, images

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        item = self.items[index]
        if self.images is None:
            with Image.open(item["source"]) as f:
                image = f.convert("RGB")
        else:
            image = self.images[item["source"]]["image"].convert("RGB")
        target = {
            k: v if k == "image_id" else [list(x) if isinstance(x, list) else x for x in v]
            for k, v in item["target"].items()
        }  # copies: callers may edit them
        return self.transform(image), target


def collate(batch: list[tuple[torch.Tensor, dict[str, Any]]]) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Images stacked (all are letterboxed to one size), targets as a list (questions per image vary)."""
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


class VQAv2Data(SplitDataModule):
    """VQAv2 for a vision-language task: one item per image with all its questions.

    Exactly one of ``root`` (the official layout, see the module docstring) and ``hf_dataset``
    (one row per question, as HuggingFaceM4/VQAv2: columns ``image``, ``question``,
    ``question_id``, ``image_id``, ``answers`` (10 strings or ``{"answer": ...}`` dicts),
    ``answer_type``, optionally ``question_type`` and ``multiple_choice_answer``) is set. Images are
    resized (longer side to ``img_size``) and padded to a square, never flipped or cropped: that
    would change the answer of "the square on the left" or cut the object out.

    Each item is ``(image (3, img_size, img_size), target)`` with target ``{"image_id": int,
    "question_ids": list[int], "questions": list[str], "answers": list[list[str]] (10 each),
    "answer_types": list[str], "question_types": list[str], "multiple_choice_answers": list[str]}``.

    Args:
        root: folder with the official files and the ``{split}/`` image folders.
        hf_dataset: Hugging Face dataset name or ``save_to_disk`` folder.
        hf_config: dataset configuration name.
        train_split, val_split: split names (official: ``train2014``/``val2014``; HuggingFaceM4/VQAv2:
            ``train``/``validation``).
        img_size: square input size (the vision tower's).
        mean, std: normalisation (the vision tower's; OpenAI CLIP's by default).
        batch_size: images (not questions) per batch.
        num_workers, shuffle_seed: loader settings.
        strict: stop at the first unreadable image instead of skipping and counting it.
        max_questions: keep at most this many questions per image (the first by question_id) to
            bound the language side of a batch.
    """

    test_key = "val"

    def __init__(
        self,
        root: str | None = None,
        hf_dataset: str | None = None,
        hf_config: str | None = None,
        train_split: str = "train2014",
        val_split: str = "val2014",
        img_size: int = 336,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
        batch_size: int = 8,
        num_workers: int = 4,
        shuffle_seed: int = 0,
        strict: bool = False,
        max_questions: int | None = None,
    ) -> None:
        super().__init__()
        if (root is None) == (hf_dataset is None):
            raise ValueError("set exactly one of data.root (the official VQAv2 files) and data.hf_dataset")
        if root is not None:
            require_dir(root, "data.root")
        if max_questions is not None and max_questions < 1:
            raise ValueError(f"data.max_questions={max_questions}: use at least 1 (or null for all)")
        self.save_hyperparameters()
        self.mean, self.std, self.img_size = tuple(mean), tuple(std), img_size
        self.batch_size = batch_size
        self.datasets: dict[str, Dataset] = {}

    def transform(self) -> Any:
        """Letterbox: longer side to ``img_size``, normalise, pad bottom/right (with the mean colour)."""
        return v2.Compose(
            [
                v2.PILToTensor(),
                v2.Resize(size=None, max_size=self.img_size, antialias=True),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(self.mean, self.std),
                PadTo(self.img_size),
            ]
        )

    def _exists(self, name: str) -> bool:
        hp = self.hparams
        if hp.root is not None:
            return questions_file(Path(hp.root), name).is_file()
        return name in self.hf_splits()

    def _split(self, name: str) -> Dataset:
        hp = self.hparams
        if hp.root is not None:
            items = load_vqa(Path(hp.root), name, hp.max_questions)
            ds = VQAImages(items, self.transform())
            return SkipCorrupt(ds, lambda i: str(ds.items[i]["source"]), hp.strict)
        splits = self.hf_splits()
        label = f"data.hf_dataset={hp.hf_dataset!r}[{name}]"
        if name not in splits:
            raise FileNotFoundError(
                f"{label}: no such split (splits: {list(splits)}); set data.train_split/val_split"
            )
        items = load_vqa_hf(splits[name], label, hp.max_questions)
        ds = VQAImages(items, self.transform(), splits[name].select_columns(["image"]))
        return SkipCorrupt(
            ds,
            lambda i: f"{label} image_id {ds.items[i]['target']['image_id']} (row {ds.items[i]['source']})",
            hp.strict,
        )

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if "val" not in self.datasets:
            self.datasets["val"] = self._split(hp.val_split)
        if "train" not in self.datasets and (stage == "fit" or self._exists(hp.train_split)):
            self.datasets["train"] = self._split(hp.train_split)

    collate_fn = staticmethod(collate)
