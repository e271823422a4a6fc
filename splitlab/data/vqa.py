"""VQAv2: `VQAv2Data` reads the official files (or a Hugging Face dataset) and checks them before training.

The official layout, per split (``train2014``, ``val2014``)::

    v2_OpenEnded_mscoco_{split}_questions.json   {"questions": [{"image_id", "question", "question_id"}]}
    v2_mscoco_{split}_annotations.json           {"annotations": [{"question_id", "image_id", "answers": [10 x
                                                  {"answer", ...}], "answer_type", "question_type",
                                                  "multiple_choice_answer"}]}
    {split}/COCO_{split}_{image_id:012d}.jpg

One dataset item is one image with *all* its questions, so the vision model (the expensive,
token-allocating part) runs once per image however many questions it has. `splitlab.data.generators.vqa_scenes`
writes small synthetic sets in this layout.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from splitlab.data.common import (
    FolderOrHubData,
    SkipCorrupt,
    require_dir,
)
from splitlab.data.hf import image_source, undecoded_images
from splitlab.metrics.vqa import ANSWERS_PER_QUESTION, VQA_ANSWER_TYPES
from splitlab.model.images import ImageDecoder
from splitlab.model.preprocess import LETTERBOX_FILTERS, Preprocessing

# OpenAI CLIP's normalisation (the usual VQA vision towers: CLIP / SigLIP-style ViTs at 336 px)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

SPLITS = ("train2014", "val2014")
QUESTION_TYPES = ("what pattern", "what color", "is there", "how many")
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<image>")


def questions_file(root: Path, split: str) -> Path:
    """The official questions file of ``split``."""
    return root / f"v2_OpenEnded_mscoco_{split}_questions.json"


def annotations_file(root: Path, split: str) -> Path:
    """The official annotations file of ``split``."""
    return root / f"v2_mscoco_{split}_annotations.json"


def image_split(split: str) -> str:
    """The COCO image folder of a question split: test-dev is a subset of test2015's images."""
    return "test2015" if split == "test-dev2015" else split


def image_name(split: str, image_id: int, suffix: str = ".jpg") -> str:
    """COCO's file name of ``image_id`` in (the image folder of) ``split``."""
    return f"COCO_{image_split(split)}_{image_id:012d}{suffix}"


def vqa_words(text: str) -> list[str]:
    """Lower-cased words with punctuation split off (the tokenisation behind ``vocab.json``)."""
    return re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())


def write_vocabulary(
    root: str | Path,
    splits: Sequence[str] = ("train2014", "val2014"),
    extra: str = "",
    out: str | Path | None = None,
) -> Path:
    """``vocab.json`` (the word list a word-level tokenizer reads) for a folder in the official VQAv2
    layout: `SPECIAL_TOKENS`, then every word of the questions and answers of ``splits`` (those whose
    files are there; at least one must be) and of ``extra`` (e.g. the prompt's own words).

    Returns the file written (``root/vocab.json`` unless ``out`` says otherwise).
    """
    root = Path(root)
    words: set[str] = set(vqa_words(extra.replace("<image>", " ").replace("{question}", " ")))
    read = []
    for split in splits:
        if not questions_file(root, split).is_file():
            continue
        read.append(split)
        for q in _read_json(questions_file(root, split), "questions", "questions"):
            words.update(vqa_words(str(q.get("question", ""))))
        if annotations_file(root, split).is_file():
            for a in _read_json(annotations_file(root, split), "annotations", "annotations"):
                for answer in _answer_strings(a.get("answers", [])):
                    words.update(vqa_words(answer))
    if not read:
        raise FileNotFoundError(
            f"{root}: no questions file of {list(splits)} (VQAv2 layout: {questions_file(root, splits[0]).name})"
        )
    path = Path(out) if out is not None else root / "vocab.json"
    path.write_text(json.dumps([*SPECIAL_TOKENS, *sorted(words - set(SPECIAL_TOKENS))], indent=1) + "\n")
    return path


def most_frequent(answers: Sequence[str]) -> str:
    """The most frequent answer (first given on ties), as VQAv2's ``multiple_choice_answer``."""
    return Counter(answers).most_common(1)[0][0]


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
    if answer_type not in VQA_ANSWER_TYPES:
        raise ValueError(
            f"{where}: question_id {question_id} has answer_type {answer_type!r}; "
            f"expected one of {', '.join(repr(t) for t in VQA_ANSWER_TYPES)}"
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


def load_vqa(
    root: Path, split: str, max_questions: int | None = None, answers: bool = True
) -> list[dict[str, Any]]:
    """Read and check one split of the official files: one item per image, ``{"source": image path,
    "target": the target dict}``.

    Checks (each error names the file): both files exist; every question has an annotation with
    10 answers and a known answer type; questions and annotations agree on the image; every
    image exists as ``{split}/COCO_{split}_{id:012d}.jpg`` or ``.png``. With ``answers=False``
    (predict) a split without annotations file is read from its questions alone (test-dev and
    test2015 publish none): its targets have no answers.
    """
    q_path, a_path = questions_file(root, split), annotations_file(root, split)
    questions = _read_json(q_path, "questions", "questions")
    if not answers and not a_path.is_file():
        unanswered = {"answers": [], "answer_type": "", "question_type": "", "multiple_choice_answer": ""}
        annotations = {q["question_id"]: {**unanswered, "image_id": q["image_id"]} for q in questions}
        return _group(
            _rows(questions, annotations, _image_files(root, split, questions, q_path)), max_questions
        )
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
    return _group(_rows(questions, annotations, _image_files(root, split, questions, q_path)), max_questions)


def _image_files(root: Path, split: str, questions: list[dict[str, Any]], q_path: Path) -> dict[int, Path]:
    """Each asked-about image's file (``.jpg`` or ``.png``); all missing ones named in one error."""
    folder = root / image_split(split)
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
    return files


def _rows(
    questions: list[dict[str, Any]], annotations: dict[int, dict[str, Any]], files: dict[int, Path]
) -> list[dict[str, Any]]:
    """One row per question: the question, its annotation's fields and its image file."""
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
                "multiple_choice_answer": ann.get("multiple_choice_answer")
                or (most_frequent(ann["answers"]) if ann["answers"] else ""),
                "source": files[q["image_id"]],
            }
        )
    return rows


HF_COLUMNS = ("image", "question", "question_id", "image_id", "answers", "answer_type")


def load_vqa_hf(
    split: Any, name: str, max_questions: int | None = None, answers: bool = True
) -> list[dict[str, Any]]:
    """Items like `load_vqa` from a `datasets` split with one row per question (``source`` is the
    row holding the image). ``question_type`` and ``multiple_choice_answer`` are optional columns
    (empty, and the most frequent answer, when absent). With ``answers=False`` (predict) rows without
    answers (a test split) are kept unanswered."""
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
        given = _answer_strings(row["answers"] or [])
        if answers or given:
            check_annotation(given, row["answer_type"], row["question_id"], name)
        rows.append(
            {
                "image_id": int(row["image_id"]),
                "question_id": int(row["question_id"]),
                "question": row["question"],
                "answers": given,
                "answer_type": row["answer_type"] or "",
                "question_type": row.get("question_type") or "",
                "multiple_choice_answer": row.get("multiple_choice_answer")
                or (most_frequent(given) if given else ""),
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
        exif_transpose: read images upright by their EXIF orientation (`ImageDecoder`).
        high_depth: how 16-bit, 32-bit and float images become 8 bits (`ImageDecoder`).
    """

    def __init__(
        self,
        items: list[dict[str, Any]],
        transform: Any,
        images: Any = None,
        exif_transpose: bool = True,
        high_depth: str = "range",
    ) -> None:
        self.items, self.transform, self.images = items, transform, images
        self.decode = ImageDecoder(exif_transpose, high_depth)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        item = self.items[index]
        if self.images is None:
            image = self.decode(item["source"])
        else:
            cell = self.images[item["source"]]["image"]
            image = self.decode(image_source(cell), f"row {item['source']}")
        target = {
            k: v if k == "image_id" else [list(x) if isinstance(x, list) else x for x in v]
            for k, v in item["target"].items()
        }  # copies: callers may edit them
        return self.transform(image), target


def collate(batch: list[tuple[torch.Tensor, dict[str, Any]]]) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Images stacked (all are letterboxed to one size), targets as a list (questions per image vary)."""
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


class VQAv2Data(FolderOrHubData):
    """VQAv2 for a vision-language task: one item per image with all its questions.

    Exactly one of ``root`` (the official layout, see the module docstring: the official files and
    the ``{split}/`` image folders) and ``hf_dataset`` (one row per question, as HuggingFaceM4/VQAv2:
    columns ``image``, ``question``, ``question_id``, ``image_id``, ``answers`` (10 strings or
    ``{"answer": ...}`` dicts), ``answer_type``, optionally ``question_type`` and
    ``multiple_choice_answer``) is set. Images are resized (longer side to ``img_size``, bicubic with
    antialiasing as CLIP's image processor) and padded to a square, never flipped or cropped: that
    would change the answer of "the square on the left" or cut the object out. The ``predict_split``
    may have questions only (``test-dev2015``, ``test2015``), for the official server.

    Each item is ``(image (3, img_size, img_size), target)`` with target ``{"image_id": int,
    "question_ids": list[int], "questions": list[str], "answers": list[list[str]] (10 each),
    "answer_types": list[str], "question_types": list[str], "multiple_choice_answers": list[str]}``.

    Args:
        train_split, val_split: split names (official: ``train2014``/``val2014``; HuggingFaceM4/VQAv2:
            ``train``/``validation``).
        img_size: square input size (the vision tower's).
        mean, std: normalisation (the vision tower's; OpenAI CLIP's by default).
        batch_size: images (not questions) per batch.
        max_questions: keep at most this many questions per image (the first by question_id) to
            bound the language side of a batch.
        pad: where the letterbox pads: ``corner`` (bottom/right) or ``centre`` (both sides evenly, as
            LLaVA-1.5's ``expand2square``: what a LLaVA projector and LM were trained on).
        interpolation: the resize filter, antialiased: ``bicubic`` (CLIP's image processor,
            ``resample=3``, which LLaVA-1.5 applies) or ``bilinear`` (splitlab before; checkpoints keep
            the one they were trained with).
        **kwargs: `FolderOrHubData`'s (``root``, ``hf_dataset``, ...) and `BaseDataModule`'s settings.
    """

    test_key = "val"
    layout = "the official VQAv2 files"
    square = "VQAv2"

    def __init__(
        self,
        train_split: str = "train2014",
        val_split: str = "val2014",
        img_size: int | Sequence[int] = 336,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
        batch_size: int = 8,
        max_questions: int | None = None,
        pad: str = "corner",
        interpolation: str = "bicubic",
        **kwargs: Any,
    ) -> None:
        if pad not in ("corner", "centre"):
            raise ValueError(f"data.pad={pad!r}: expected 'corner' or 'centre'")
        if interpolation not in LETTERBOX_FILTERS:
            raise ValueError(f"data.interpolation={interpolation!r}: expected 'bicubic' or 'bilinear'")
        super().__init__(img_size=img_size, mean=mean, std=std, batch_size=batch_size, **kwargs)
        if self.hparams.root is not None:
            require_dir(self.hparams.root, "data.root")
        if max_questions is not None and max_questions < 1:
            raise ValueError(f"data.max_questions={max_questions}: use at least 1 (or null for all)")

    @property
    def preprocessing(self) -> Preprocessing:
        """The model's input: the longer side to ``img_size`` (``interpolation``), normalised, padded
        square (with the mean colour) at ``pad``."""
        hp = self.hparams
        return self.model_input(interpolation=hp.interpolation, pad=hp.pad)

    def transform(self) -> Any:
        """The letterbox of `preprocessing`, on PIL images."""
        return self.preprocessing.image_transform

    def _subset(self, setting: str, answers: bool = True) -> Dataset:
        hp = self.hparams
        name = hp[setting] if setting != "predict_split" else hp.predict_split or hp.val_split
        if hp.root is not None:
            items = load_vqa(Path(hp.root), name, hp.max_questions, answers)
            ds = VQAImages(
                items, self.transform(), exif_transpose=hp.exif_transpose, high_depth=hp.high_depth
            )
            return SkipCorrupt(ds, lambda i: str(ds.items[i]["source"]), hp.strict)
        splits = self.hf_splits()
        label = f"data.hf_dataset={hp.hf_dataset!r}[{name}]"
        if name not in splits:
            raise self.missing_split(setting, name)
        items = load_vqa_hf(splits[name], label, hp.max_questions, answers)
        images = undecoded_images(splits[name].select_columns(["image"]), ["image"])
        ds = VQAImages(items, self.transform(), images, hp.exif_transpose, hp.high_depth)
        return SkipCorrupt(
            ds,
            lambda i: f"{label} image_id {ds.items[i]['target']['image_id']} (row {ds.items[i]['source']})",
            hp.strict,
        )

    def setup(self, stage: str) -> None:
        if stage == "predict":
            if "predict" not in self.datasets:
                hp = self.hparams
                self.use_for_predict(
                    self._subset("predict_split", answers=False), hp.predict_split or hp.val_split
                )
            return
        if "val" not in self.datasets:
            self.datasets["val"] = self._subset("val_split")
        if "train" not in self.datasets and stage == "fit":  # validate and test read no training questions
            self.datasets["train"] = self._subset("train_split")

    collate_fn = staticmethod(collate)
