"""VQAv2: the generator writes the official layout, `VQAv2Data` groups questions by image, bad input is named."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from splitlab.data.generators.vqa_scenes import (
    BACKGROUNDS,
    COLOURS,
    PATTERNS,
    SCENES,
    SHAPES,
    fine_pattern,
    generate_vqa,
    render_vqa_scene,
    shape_mask,
)
from splitlab.data.vqa import QUESTION_TYPES, SPECIAL_TOKENS, VQAv2Data, vqa_words
from splitlab.metrics import VQA_ANSWER_TYPES


@pytest.fixture(scope="module")
def vqa_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny official-layout set, read only (tests that break files copy it first)."""
    return generate_vqa(tmp_path_factory.mktemp("vqa") / "vqa", img_size=64, train=4, val=2, seed=0)


def _copy(root: Path, to: Path) -> Path:
    import shutil

    return Path(shutil.copytree(root, to / "vqa"))


def _docs(root: Path, split: str) -> tuple[Path, dict, Path, dict]:
    q_path = root / f"v2_OpenEnded_mscoco_{split}_questions.json"
    a_path = root / f"v2_mscoco_{split}_annotations.json"
    return q_path, json.loads(q_path.read_text()), a_path, json.loads(a_path.read_text())


def _setup(root: Path, **kwargs) -> VQAv2Data:
    dm = VQAv2Data(root=str(root), img_size=64, batch_size=2, num_workers=0, **kwargs)
    dm.setup("fit")
    return dm


def test_official_layout_and_keys(vqa_root: Path) -> None:
    for split, count in (("train2014", 4), ("val2014", 2)):
        _, questions, _, annotations = _docs(vqa_root, split)
        assert {"info", "task_type", "data_type", "data_subtype", "questions"} <= questions.keys()
        assert (questions["task_type"], questions["data_type"], questions["data_subtype"]) == (
            "Open-Ended",
            "mscoco",
            split,
        )
        assert {"info", "data_type", "data_subtype", "annotations"} <= annotations.keys()
        assert annotations["data_subtype"] == split
        assert all(q.keys() == {"image_id", "question", "question_id"} for q in questions["questions"])
        image_ids = sorted({q["image_id"] for q in questions["questions"]})
        assert len(image_ids) == count
        for image_id in image_ids:
            path = vqa_root / split / f"COCO_{split}_{image_id:012d}.png"
            with Image.open(path) as image:
                assert image.format == "PNG" and image.size == (64, 64)
        per_image = Counter(q["image_id"] for q in questions["questions"])
        assert all(3 <= n <= 4 for n in per_image.values())
        assert [a["question_id"] for a in annotations["annotations"]] == [
            q["question_id"] for q in questions["questions"]
        ]
        for ann in annotations["annotations"]:
            assert ann.keys() == {
                "question_id",
                "image_id",
                "question_type",
                "answer_type",
                "multiple_choice_answer",
                "answers",
            }
            assert len(ann["answers"]) == 10
            assert [a["answer_id"] for a in ann["answers"]] == list(range(1, 11))
            assert all(a["answer_confidence"] in ("yes", "maybe", "no") for a in ann["answers"])
            assert ann["answer_type"] in VQA_ANSWER_TYPES
            assert ann["question_type"] in QUESTION_TYPES
            counts = Counter(a["answer"] for a in ann["answers"]).most_common()
            assert ann["multiple_choice_answer"] == counts[0][0]
    meta = json.loads((vqa_root / "splitlab_dataset.json").read_text())
    assert meta["generator"] == "splitlab data vqa" and meta["splits"] == {"train2014": 4, "val2014": 2}


def test_question_kinds_answers_and_vocab(vqa_root: Path) -> None:
    annotations = [a for s in ("train2014", "val2014") for a in _docs(vqa_root, s)[3]["annotations"]]
    questions = [q for s in ("train2014", "val2014") for q in _docs(vqa_root, s)[1]["questions"]]
    assert {a["question_type"] for a in annotations} == set(QUESTION_TYPES)
    kinds = {a["question_type"]: a["answer_type"] for a in annotations}
    assert kinds == {
        "what pattern": "other",
        "what color": "other",
        "is there": "yes/no",
        "how many": "number",
    }
    for a in annotations:
        right = a["multiple_choice_answer"]
        if a["question_type"] == "what pattern":
            assert right in ("horizontal", "vertical", "checks")
        elif a["question_type"] == "what color":
            assert right in COLOURS
        elif a["question_type"] == "is there":
            assert right in ("yes", "no")
        else:
            assert right in ("2", "3")
    given = [x["answer"] for a in annotations for x in a["answers"]]
    assert sum(
        g != a["multiple_choice_answer"] for a in annotations for g in [x["answer"] for x in a["answers"]]
    )
    assert set(given) - {a["multiple_choice_answer"] for a in annotations}  # synonyms or wrong answers occur
    vocab = json.loads((vqa_root / "vocab.json").read_text())
    assert vocab[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    words = vocab[len(SPECIAL_TOKENS) :]
    assert words == sorted(set(words))
    assert set(words) == {w for t in [q["question"] for q in questions] + given for w in vqa_words(t)}
    assert {"?", "what", "pattern", "square"} <= set(words)
    assert vqa_words("Is there a RED square?") == ["is", "there", "a", "red", "square", "?"]


def test_pattern_lives_only_in_fine_detail() -> None:
    rng = np.random.default_rng(3)
    for _ in range(10):
        img, squares = render_vqa_scene(rng, 128)
        assert 2 <= len(squares) <= 3 and len({s["colour"] for s in squares}) == len(squares)
        for s in squares:
            x0, y0, x1, y1 = s["inner"]
            n = (min(x1 - x0, y1 - y0) // 4) * 4
            region = img[y0 : y0 + n, x0 : x0 + n].astype(np.float64)
            assert region.std(axis=(0, 1)).max() > 25  # the pattern is there at full resolution ...
            coarse = region.reshape(n // 4, 4, n // 4, 4, 3).mean(axis=(1, 3))
            assert np.ptp(coarse, axis=(0, 1)).max() <= 1.0  # ... and a 4x downsample is flat colour
            expected = np.array(COLOURS[s["colour"]]) * 255
            assert np.abs(coarse.mean(axis=(0, 1)) - expected).max() < 0.05 * 255 + 1  # the named colour
        boxes = [s["box"] for s in squares]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]  # no overlap


def test_one_patterned_square_the_one_asked_about(tmp_path: Path) -> None:
    """``patterned="one"`` (the CI twin's data): one square carries the pattern, the others are plain,
    and the pattern question names that square's colour; ``questions_per_scene`` fixes the count."""
    rng = np.random.default_rng(4)
    for _ in range(10):
        img, squares = render_vqa_scene(rng, 64, square=(0.25, 0.32), shade=0.35, patterned="one")
        spread = []
        for s in squares:
            x0, y0, x1, y1 = s["inner"]
            spread.append(img[y0:y1, x0:x1].astype(np.float64).std(axis=(0, 1)).max())
        patterned = [s for s in squares if s["pattern"] is not None]
        assert len(patterned) == 1
        assert [v > 40 for v in spread] == [s["pattern"] is not None for s in squares]  # 0.35 contrast
        assert max(v for v, s in zip(spread, squares, strict=True) if s["pattern"] is None) < 1
    root = generate_vqa(
        tmp_path / "one",
        img_size=64,
        train=6,
        val=2,
        seed=1,
        shade=0.35,
        patterned="one",
        questions_per_scene=2,
    )
    annotations = json.loads((root / "v2_mscoco_train2014_annotations.json").read_text())["annotations"]
    questions = json.loads((root / "v2_OpenEnded_mscoco_train2014_questions.json").read_text())["questions"]
    per_image: dict[int, list[str]] = {}
    for a in annotations:
        per_image.setdefault(a["image_id"], []).append(a["question_type"])
    assert all(len(kinds) == 2 and kinds[0] == "what pattern" for kinds in per_image.values())
    assert all(kinds[1] in ("what color", "is there", "how many") for kinds in per_image.values())
    assert all(q["question"].startswith("what pattern is inside the") for q in questions[::2])
    meta = json.loads((root / "splitlab_dataset.json").read_text())
    assert (meta["patterned"], meta["shade"], meta["questions_per_scene"]) == ("one", 0.35, 2)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"shade": 0.6}, "shade=0.6"),
        ({"patterned": "some"}, "patterned='some'"),
        ({"questions_per_scene": 5}, "questions_per_scene=5"),
        ({"square": (0.3, 0.2)}, "square=(0.3, 0.2)"),
        ({"shape": "hexagon"}, "shape='hexagon'"),
        ({"patterns": ("checks", "dots")}, "patterns=('checks', 'dots')"),
        ({"patterns": ("checks",)}, "patterns=('checks',)"),
        ({"patterns": ("checks", "checks")}, "patterns=('checks', 'checks')"),
        ({"objects": (1, 3)}, "objects=(1, 3)"),
        ({"objects": (2, 5)}, "objects=(2, 5)"),
        ({"objects": (3, 2)}, "objects=(3, 2)"),
        ({"background": "grass"}, "background='grass'"),
    ],
)
def test_generator_settings_are_checked(tmp_path: Path, setting: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        generate_vqa(tmp_path / "bad", img_size=64, train=1, val=1, **setting)


def test_same_seed_same_files(tmp_path: Path) -> None:
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    a = files(generate_vqa(tmp_path / "a", img_size=48, train=2, val=1, seed=5))
    b = files(generate_vqa(tmp_path / "b", img_size=48, train=2, val=1, seed=5))
    c = files(generate_vqa(tmp_path / "c", img_size=48, train=2, val=1, seed=6))
    assert a == b and a != c


def _digest(root: Path) -> str:
    """SHA-256 over the files (decoded pixels for PNGs, so a zlib build cannot change it), the
    dataset note (``splitlab_dataset.json``, which lists the newer settings too) left out."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "splitlab_dataset.json":
            h.update(str(path.relative_to(root)).encode())
            h.update(np.asarray(Image.open(path)).tobytes() if path.suffix == ".png" else path.read_bytes())
    return h.hexdigest()


def test_the_default_and_the_twins_scenes_are_unchanged(tmp_path: Path) -> None:
    """The shape, pattern, count and background settings leave the original scenes as they were
    (digests of the generator before those settings): the twin's measured numbers stand."""
    default = generate_vqa(tmp_path / "default", img_size=64, train=3, val=2, seed=7)
    assert _digest(default) == "a036c6e9e1f896f520d409fb11531c57919b5e23dea5124e26f85e5fb09206f7"
    twin = {**SCENES["twin"], "train": 3, "val": 2}
    assert _digest(generate_vqa(tmp_path / "twin", seed=7, **twin)) == (
        "7e221938a9612be121b5ba745406e237274de507e633f94dd7055d8caab44d04"
    )
    meta = json.loads((default / "splitlab_dataset.json").read_text())
    assert meta["patterns"] == ["horizontal", "vertical", "checks"]
    assert (meta["shape"], meta["objects"], meta["background"]) == ("square", [2, 3], "busy")


@pytest.mark.parametrize("kind", list(PATTERNS))
def test_every_pattern_averages_out_at_4x4(kind: str) -> None:
    """Half of every 4x4 window is light, whatever the offset: colour from coarse tokens, the pattern
    only from fine ones."""
    mask = fine_pattern(kind, 17).astype(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(mask, (4, 4)).mean(axis=(2, 3))
    assert np.all(windows == 0.5)


def test_patterns_differ_and_pairs_differ_only_in_orientation() -> None:
    masks = {kind: fine_pattern(kind, 16) for kind in PATTERNS}
    assert len({m.tobytes() for m in masks.values()}) == len(PATTERNS)
    assert np.array_equal(masks["hstripes"].T, masks["vstripes"])
    # rising ("/") mirrored left-right is a falling ("\\") pattern, up to where the stripes start
    mirrored = masks["rising"][:, ::-1]
    assert any(np.array_equal(mirrored, np.roll(masks["falling"], k, axis=1)) for k in range(4))
    with pytest.raises(ValueError, match="pattern 'dots'"):
        fine_pattern("dots", 8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("background", BACKGROUNDS)
def test_shapes_and_backgrounds(shape: str, background: str) -> None:
    """Each object is its shape in its base colour; the pattern lies inside the shape only."""
    rng = np.random.default_rng(11)
    for _ in range(4):
        img, objects = render_vqa_scene(
            rng,
            64,
            square=(0.25, 0.31),
            shade=0.35,
            patterned="one",
            shape=shape,
            patterns=("rising", "falling", "zigzag"),
            objects=(3, 4),
            background=background,
        )
        assert 3 <= len(objects) <= 4 and {o["shape"] for o in objects} == {shape}
        for o in objects:
            x0, y0, x1, y1 = o["box"]
            inside = shape_mask(shape, x1 - x0)
            pixels = img[y0:y1, x0:x1][inside].astype(np.float64)
            if o["pattern"] is None:
                assert pixels.std(axis=0).max() < 1  # plain: one colour over the whole shape
            else:
                assert o["pattern"] in ("rising", "falling", "zigzag")
                assert pixels.std(axis=0).max() > 40  # the pattern at 0.35 contrast
            assert inside[0, 0] == (shape == "square")  # the top-left corner is background otherwise
    with pytest.raises(ValueError, match="shape='hexagon'"):
        shape_mask("hexagon", 8)


def test_questions_name_the_shape_and_the_pattern_set(tmp_path: Path) -> None:
    root = generate_vqa(tmp_path / "c", seed=2, **{**SCENES["circles"], "train": 30, "val": 5})
    annotations = json.loads((root / "v2_mscoco_train2014_annotations.json").read_text())["annotations"]
    questions = json.loads((root / "v2_OpenEnded_mscoco_train2014_questions.json").read_text())["questions"]
    assert all("square" not in q["question"] for q in questions)
    assert all(" circle" in q["question"] for q in questions)
    answers = {a["question_type"]: set() for a in annotations}
    for a in annotations:
        answers[a["question_type"]].add(a["multiple_choice_answer"])
    assert answers["what pattern"] <= {"horizontal", "vertical", "rising", "falling", "checks"}
    assert len(answers["what pattern"]) >= 4
    assert answers.get("how many", {"3"}) <= {"3", "4"}
    meta = json.loads((root / "splitlab_dataset.json").read_text())
    assert meta["shape"] == "circle" and meta["objects"] == [3, 4] and meta["background"] == "flat"
    assert meta["patterns"] == ["horizontal", "vertical", "rising", "falling", "checks"]
    vocab = json.loads((root / "vocab.json").read_text())
    assert {"circle", "circles", "rising", "falling"} <= set(vocab)


def test_datamodule_groups_questions_by_image(vqa_root: Path) -> None:
    dm = _setup(vqa_root)
    assert set(dm.datasets) == {"train", "val"} and dm.img_size == 64 and dm.test_key == "val"
    _, questions, _, annotations = _docs(vqa_root, "val2014")
    assert len(dm.datasets["val"]) == len({q["image_id"] for q in questions["questions"]}) == 2
    images, targets = next(iter(dm.val_dataloader()))
    assert images.shape == (2, 3, 64, 64) and images.dtype == torch.float32
    by_id = {a["question_id"]: a for a in annotations["annotations"]}
    for target in targets:
        assert target.keys() == {
            "image_id",
            "question_ids",
            "questions",
            "answers",
            "answer_types",
            "question_types",
            "multiple_choice_answers",
        }
        mine = [q for q in questions["questions"] if q["image_id"] == target["image_id"]]
        assert target["question_ids"] == [q["question_id"] for q in mine]
        assert target["questions"] == [q["question"] for q in mine]
        for qid, answers, kind in zip(
            target["question_ids"], target["answers"], target["answer_types"], strict=True
        ):
            assert (
                answers == [a["answer"] for a in by_id[qid]["answers"]] and kind == by_id[qid]["answer_type"]
            )
        n = len(mine)
        assert len(target["question_types"]) == len(target["multiple_choice_answers"]) == n
    assert sum(len(t["question_ids"]) for t in targets) == len(questions["questions"])
    capped = _setup(vqa_root, max_questions=1)
    assert all(len(capped.datasets["val"][i][1]["questions"]) == 1 for i in range(2))
    val_only = VQAv2Data(root=str(vqa_root), img_size=80, num_workers=0)
    val_only.setup("validate")
    image, _ = val_only.datasets["val"][0]
    assert image.shape == (3, 80, 80)


def test_letterbox_keeps_aspect_and_pads(tmp_path: Path, vqa_root: Path) -> None:
    root = _copy(vqa_root, tmp_path)
    _, questions, _, _ = _docs(root, "val2014")
    image_id = questions["questions"][0]["image_id"]
    png = root / "val2014" / f"COCO_val2014_{image_id:012d}.png"
    Image.open(png).crop((0, 0, 64, 32)).convert("RGB").save(png.with_suffix(".jpg"))  # a wide JPEG wins
    png.unlink()
    dm = _setup(root)
    image, target = dm.datasets["val"][0]
    assert target["image_id"] == image_id and image.shape == (3, 64, 64)
    assert image[:, 32:].abs().max() == 0  # padded with the mean colour (0 after normalising)
    assert image[:, :32].abs().max() > 0


def test_predict_reads_a_split_with_questions_only(tmp_path: Path, vqa_root: Path) -> None:
    """test-dev / test2015 publish questions without annotations: predict answers them; fit refuses."""
    root = _copy(vqa_root, tmp_path)
    _, questions, a_path, _ = _docs(root, "val2014")
    a_path.unlink()
    dm = VQAv2Data(root=str(root), img_size=64, batch_size=2, num_workers=0)
    dm.setup("predict")
    targets = [t for _, batch, _ in dm.predict_dataloader() for t in batch]
    asked = sorted(q["question_id"] for q in questions["questions"])
    assert sorted(qid for t in targets for qid in t["question_ids"]) == asked
    assert all(a == [] for t in targets for a in t["answers"])
    with pytest.raises(
        FileNotFoundError, match="v2_mscoco_val2014_annotations.json: no such annotations file"
    ):
        _setup(root)
    unanswered = VQAv2Data(root=str(root), img_size=64, predict_split="train2014", num_workers=0)
    unanswered.setup("predict")  # a split with annotations keeps its answers
    predict = unanswered.datasets["predict"]
    assert all(len(a) == 10 for i in range(len(predict)) for a in predict[i][1]["answers"])


def test_test_dev_questions_read_the_test2015_images(tmp_path: Path, vqa_root: Path) -> None:
    """The official layout: test-dev's questions name images of the test2015 folder (COCO_test2015_*)."""
    root = _copy(vqa_root, tmp_path)
    q_path, questions, _, _ = _docs(root, "val2014")
    (root / "v2_OpenEnded_mscoco_test-dev2015_questions.json").write_text(json.dumps(questions))
    (root / "test2015").mkdir()
    for image in (root / "val2014").iterdir():
        image.rename(root / "test2015" / image.name.replace("COCO_val2014_", "COCO_test2015_"))
    dm = VQAv2Data(root=str(root), img_size=64, batch_size=2, num_workers=0, predict_split="test-dev2015")
    dm.setup("predict")
    targets = [t for _, batch, _ in dm.predict_dataloader() for t in batch]
    assert sorted(qid for t in targets for qid in t["question_ids"]) == sorted(
        q["question_id"] for q in questions["questions"]
    )


def test_hf_test_split_without_answers(tmp_path: Path) -> None:
    import datasets

    image = Image.new("RGB", (40, 20), (200, 10, 10))
    rows = {
        "image": [image, image],
        "question": ["what color is it?", "is it red?"],
        "question_id": [11, 10],
        "image_id": [1, 1],
        "answers": [[], []],
        "answer_type": [None, None],
    }
    path = tmp_path / "hf"
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows)}).save_to_disk(str(path))
    dm = VQAv2Data(hf_dataset=str(path), val_split="test", predict_split="test", img_size=64, num_workers=0)
    dm.setup("predict")
    (_, target) = dm.datasets["predict"][0]
    assert target["question_ids"] == [10, 11] and target["answers"] == [[], []]
    with pytest.raises(ValueError, match="question_id 11 has 0 answers"):
        dm.setup("fit")


def test_hf_round_trip(tmp_path: Path, vqa_root: Path) -> None:
    hf = generate_vqa(tmp_path / "hf", img_size=64, train=4, val=2, seed=0, fmt="hf")
    assert (hf / "vocab.json").read_text() == (vqa_root / "vocab.json").read_text()
    from_hf = VQAv2Data(hf_dataset=str(hf), img_size=64, batch_size=2, num_workers=0)
    from_hf.setup("fit")
    official = _setup(vqa_root)
    for key in ("train", "val"):
        assert len(from_hf.datasets[key]) == len(official.datasets[key])
        for i in range(len(official.datasets[key])):
            (a, ta), (b, tb) = from_hf.datasets[key][i], official.datasets[key][i]
            assert ta == tb and torch.equal(a, b)


def test_hf_answers_as_strings_and_bad_rows(tmp_path: Path) -> None:
    import datasets

    image = Image.new("RGB", (40, 20), (200, 10, 10))
    rows = {
        "image": [image, image, image],
        "question": ["what color is it?", "is it red?", "what color is it?"],
        "question_id": [11, 10, 20],
        "image_id": [1, 1, 2],
        "answers": [["red"] * 10, ["yes"] * 9 + ["no"], ["red"] * 10],
        "answer_type": ["other", "yes/no", "other"],
    }
    path = tmp_path / "hf"
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(path))
    dm = VQAv2Data(
        hf_dataset=str(path), val_split="validation", train_split="train", img_size=32, num_workers=0
    )
    dm.setup("validate")
    assert "train" not in dm.datasets and len(dm.datasets["val"]) == 2
    image_t, target = dm.datasets["val"][0]
    assert image_t.shape == (3, 32, 32)
    assert target["question_ids"] == [10, 11] and target["multiple_choice_answers"] == ["yes", "red"]
    assert target["question_types"] == ["", ""]
    with pytest.raises(
        FileNotFoundError,
        match=r"data.train_split='train2014': no such split in .*; splits: \['validation'\]",
    ):
        VQAv2Data(hf_dataset=str(path), val_split="validation", num_workers=0).setup("fit")
    rows["answers"][2] = ["red"] * 3
    bad = tmp_path / "bad"
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(bad))
    with pytest.raises(ValueError, match=r"bad'\[validation\]: question_id 20 has 3 answers"):
        VQAv2Data(hf_dataset=str(bad), val_split="validation", num_workers=0).setup("validate")


def test_unreadable_image_is_skipped_and_named(tmp_path: Path, vqa_root: Path) -> None:
    root = _copy(vqa_root, tmp_path)
    first = sorted((root / "val2014").iterdir())[0]
    first.write_bytes(b"not a png")
    dm = _setup(root)
    with pytest.warns(UserWarning, match=f"skipping .*{first.name}"):
        _, target = dm.datasets["val"][0]
    assert target["image_id"] != int(first.stem.split("_")[-1]) and dm.datasets["val"].take_count() == 1
    assert len(list(dm.datasets["val"])) == len(dm.datasets["val"])  # iterating ends (no wrap-around)


# bad input: each check names the file (and the question or image)


def test_missing_questions_or_annotations_file(tmp_path: Path, vqa_root: Path) -> None:
    root = _copy(vqa_root, tmp_path)
    q_path, _, a_path, _ = _docs(root, "val2014")
    a_path.unlink()
    with pytest.raises(
        FileNotFoundError, match=r"v2_mscoco_val2014_annotations.json: no such annotations file"
    ):
        _setup(root)
    q_path.unlink()
    with pytest.raises(
        FileNotFoundError, match=r"v2_OpenEnded_mscoco_val2014_questions.json: no such questions"
    ):
        _setup(root)


def _edit_annotations(root: Path, edit) -> Any:
    _, _, a_path, annotations = _docs(root, "val2014")
    result = edit(annotations["annotations"])
    a_path.write_text(json.dumps(annotations))
    return result


def _drop_annotation(root: Path) -> tuple[type, str]:
    dropped = _edit_annotations(root, lambda anns: anns.pop(1)["question_id"])
    return ValueError, (
        rf"v2_mscoco_val2014_annotations.json: no annotation for 1 question\(s\), e.g. question_id {dropped}"
    )


def _answers(count: int):
    def edit(root: Path) -> tuple[type, str]:
        def cut(anns: list) -> int:
            anns[2]["answers"] = (anns[2]["answers"] * 2)[:count]
            return anns[2]["question_id"]

        qid = _edit_annotations(root, cut)
        return ValueError, rf"v2_mscoco_val2014_annotations.json: question_id {qid} has {count} answers"

    return edit


def _unknown_answer_type(root: Path) -> tuple[type, str]:
    _edit_annotations(root, lambda anns: anns[0].update(answer_type="colour"))
    return ValueError, (
        r"annotations.json: question_id \d+ has answer_type 'colour'; expected one of 'yes/no', 'number', 'other'"
    )


def _image_disagrees(root: Path) -> tuple[type, str]:
    q_path, questions, _, _ = _docs(root, "val2014")
    q = questions["questions"][0]
    q["image_id"] += 1
    q_path.write_text(json.dumps(questions))
    return ValueError, (
        rf"questions.json and .*annotations.json disagree on the image of question_id {q['question_id']}"
    )


def _missing_image(root: Path) -> tuple[type, str]:
    _, questions, _, _ = _docs(root, "val2014")
    image_id = questions["questions"][0]["image_id"]
    (root / "val2014" / f"COCO_val2014_{image_id:012d}.png").unlink()
    return FileNotFoundError, (
        rf"questions.json names 1 image\(s\) missing from .*val2014, e.g. COCO_val2014_{image_id:012d}.jpg \(or .png\)"
    )


@pytest.mark.parametrize(
    "break_it",
    [_drop_annotation, _answers(9), _answers(11), _unknown_answer_type, _image_disagrees, _missing_image],
    ids=[
        "question-without-annotation",
        "9-answers",
        "11-answers",
        "answer-type",
        "image-disagrees",
        "missing-image",
    ],
)
def test_files_that_disagree_are_refused_naming_the_file_and_id(
    tmp_path: Path, vqa_root: Path, break_it
) -> None:
    root = _copy(vqa_root, tmp_path)
    error, message = break_it(root)
    with pytest.raises(error, match=message):
        _setup(root)


def test_settings_are_checked(tmp_path: Path, vqa_root: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of data.root"):
        VQAv2Data()
    with pytest.raises(FileNotFoundError, match="data.root="):
        VQAv2Data(root=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="data.max_questions=0"):
        VQAv2Data(root=str(vqa_root), max_questions=0)
    with pytest.raises(ValueError, match="img_size=32"):
        generate_vqa(tmp_path / "small", img_size=32)


def test_command_writes_the_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from splitlab.commands import run

    out = tmp_path / "cli"
    assert run(["data", "vqa", "--out", str(out), "--train", "2", "--val", "1", "--img-size", "64"]) == 0
    assert str(out) in capsys.readouterr().out
    assert (out / "v2_OpenEnded_mscoco_train2014_questions.json").is_file()
    assert len(list((out / "val2014").glob("COCO_val2014_*.png"))) == 1
    assert run(["data", "vqa", "--out", str(tmp_path / "cli2"), "--train", "2", "--val", "1"]) == 0
    twin = ["--patterned", "one", "--shade", "0.35", "--questions-per-scene", "2", "--square", "0.19", "0.25"]
    assert run(["data", "vqa", "--out", str(tmp_path / "cli3"), "--train", "2", "--val", "1", *twin]) == 0
    meta = json.loads((tmp_path / "cli3" / "splitlab_dataset.json").read_text())
    assert (meta["patterned"], meta["shade"], meta["questions_per_scene"]) == ("one", 0.35, 2)
    other = ["--shape", "triangle", "--patterns", "rising", "falling", "zigzag", "--objects", "3", "4"]
    other += ["--background", "noise"]
    assert run(["data", "vqa", "--out", str(tmp_path / "cli4"), "--train", "2", "--val", "1", *other]) == 0
    meta = json.loads((tmp_path / "cli4" / "splitlab_dataset.json").read_text())
    assert (meta["shape"], meta["objects"], meta["background"]) == ("triangle", [3, 4], "noise")
    assert meta["patterns"] == ["rising", "falling", "zigzag"]


def test_the_commands_choices_are_the_generators() -> None:
    """``splitlab data vqa`` lists its choices without importing the generator: they must agree."""
    import argparse

    from splitlab.commands import data

    parser = argparse.ArgumentParser()
    data.add_parser(parser.add_subparsers(dest="command"))
    vqa = parser._subparsers._group_actions[0].choices["data"]._subparsers._group_actions[0].choices["vqa"]
    choices = {a.dest: tuple(a.choices) for a in vqa._actions if a.choices}
    assert choices["shape"] == SHAPES
    assert choices["patterns"] == tuple(PATTERNS)
    assert choices["background"] == BACKGROUNDS


@pytest.mark.parametrize(("pad", "content_rows"), [("corner", range(0, 32)), ("centre", range(16, 48))])
def test_letterbox_pads_at_the_corner_or_evenly(vqa_root: Path, pad: str, content_rows: range) -> None:
    """A 2:1 image at 64 px is 64 x 32; LLaVA-1.5 pads it evenly (expand2square), the default bottom/right."""
    dm = VQAv2Data(root=str(vqa_root), img_size=64, num_workers=0, pad=pad)
    image = dm.transform()(Image.new("RGB", (40, 20), (250, 250, 250)))
    filled = [int(r) for r in torch.nonzero(image.abs().sum((0, 2)) > 0).flatten()]
    assert image.shape == (3, 64, 64) and filled == list(content_rows)
    with pytest.raises(ValueError, match="data.pad='middle': expected 'corner' or 'centre'"):
        VQAv2Data(root=str(vqa_root), pad="middle")


def test_images_are_resized_bicubic_as_clips_processor_and_as_the_deployed_model(
    tmp_path: Path, vqa_root: Path
) -> None:
    """LLaVA-1.5's vision tower reads images through CLIP's image processor (openai/clip-vit-large-patch14-336:
    ``resample=3``, bicubic, antialiased): a square image (no padding) comes out as the processor makes it.
    The deployed model (its `Preprocessing`, as config.json stores it) resizes as validation does, and
    a model saved with the older bilinear letterbox keeps it."""
    from torchvision.transforms import v2
    from transformers import CLIPImageProcessor

    from splitlab.data.vqa import CLIP_STD
    from splitlab.model import Preprocessing
    from splitlab.model.preprocess import PadTo

    rng = np.random.default_rng(0)
    square = Image.fromarray(rng.integers(0, 256, (150, 150, 3), dtype=np.uint8))
    clip = CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
    assert clip.resample == 3
    theirs = clip(square, return_tensors="pt")["pixel_values"][0]
    ours = VQAv2Data(root=str(vqa_root), img_size=64, num_workers=0).transform()(square)
    bilinear = VQAv2Data(root=str(vqa_root), img_size=64, num_workers=0, interpolation="bilinear")
    one_level = 1 / 255 / min(CLIP_STD)  # one grey level, normalised (PIL's bicubic and torch's differ by 1)
    assert ours.shape == theirs.shape == (3, 64, 64)
    assert (ours - theirs).abs().max() <= 1.5 * one_level
    assert (bilinear.transform()(square) - theirs).abs().max() > 10 * one_level

    root = _copy(vqa_root, tmp_path)
    dm = VQAv2Data(root=str(root), img_size=48, num_workers=0)  # the 64 px scenes are resized
    dm.setup("validate")
    folder = dm.datasets["val"].dataset
    file = folder.items[0]["source"]
    Image.open(file).convert("RGB").crop((0, 0, 64, 40)).save(file)  # wide: resized and padded
    image, _ = folder[0]
    deployed = Preprocessing.from_dict(json.loads(json.dumps(dm.preprocessing.to_dict())))
    assert deployed.interpolation == "bicubic" and deployed.pad == dm.hparams.pad
    assert torch.equal(image, deployed(Image.open(file))[0])
    older = Preprocessing.from_dict({**deployed.to_dict(), "interpolation": "bilinear"})
    as_before = v2.Compose(  # the letterbox before it took the interpolation: bilinear, antialiased
        [
            v2.PILToTensor(),
            v2.Resize(size=None, max_size=48, antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(older.mean, older.std),
            PadTo(48),
        ]
    )
    assert torch.equal(older(Image.open(file))[0], as_before(Image.open(file).convert("RGB")))
    assert not torch.equal(older(Image.open(file))[0], image)
    with pytest.raises(ValueError, match="data.interpolation='nearest': expected 'bicubic' or 'bilinear'"):
        VQAv2Data(root=str(vqa_root), interpolation="nearest")
    with pytest.raises(ValueError, match="the letterbox resizes with one of"):
        Preprocessing(64, interpolation="lanczos")


def test_images_are_decoded_as_predict_decodes_them(tmp_path: Path, vqa_root: Path) -> None:
    """A 16-bit image is asked about as its 8-bit twin (not a white page), as predict reads it; a photo
    stored turned is read upright, or as stored with ``exif_transpose`` off."""
    from PIL import ExifTags

    from tests.model.user_images import sixteen_bit

    root = _copy(vqa_root, tmp_path)
    dm = VQAv2Data(root=str(root), img_size=64, num_workers=0)
    dm.setup("validate")
    folder = dm.datasets["val"].dataset
    deep, turned = (Path(item["source"]) for item in folder.items[:2])
    grey = np.asarray(Image.open(deep).convert("L"))
    grey = ((grey.astype(float) - grey.min()) * 255 / (grey.max() - grey.min())).round().astype(np.uint8)
    Image.fromarray(sixteen_bit(grey)).save(deep)
    upright = Image.open(turned).convert("RGB").crop((0, 0, 64, 40))
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    upright.rotate(90, expand=True).save(turned, exif=exif)
    image, _ = folder[0]
    assert torch.equal(image, dm.preprocessing(Image.open(deep))[0])
    assert torch.equal(image, dm.preprocessing(Image.fromarray(grey))[0]) and image.std() > 0.5
    assert torch.equal(folder[1][0], dm.preprocessing(upright)[0])
    as_stored = VQAv2Data(root=str(root), img_size=64, num_workers=0, exif_transpose=False)
    as_stored.setup("validate")
    image, _ = as_stored.datasets["val"].dataset[1]
    assert torch.equal(image, as_stored.preprocessing(upright.rotate(90, expand=True))[0])
    assert not torch.equal(image, folder[1][0]) and as_stored.preprocessing.exif_transpose is False
