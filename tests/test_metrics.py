"""splitlab.metrics by hand: fine-token coverage (segmentation cells, detection boxes and masks), the
ADE20K stuff classes, COCO box mAP against pycocotools (crowd regions included), and VQA accuracy (answer normalisation, per-question scores and the metric).

VQA expected values follow the VQAv2 rules (GT-Vision-Lab/VQA,
PythonEvaluationTools/vqaEvaluation/vqaEval.py): a question scores the mean, over the ten ways to hold
out one human answer, of ``min(1, matches among the other nine / 3)``; the answers are first normalised
as today's official script, its 2016 version or lmms-eval do (``mode``).
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch

from splitlab.heads import without_crowd
from splitlab.metrics import (
    VQA_MODES,
    FineCoverage,
    VQAAccuracy,
    cell_classes,
    coco_truth,
    detection_metrics,
    normalize_answer,
    timed,
    vqa_score,
)
from splitlab.tokenizer import Levels, build_layout


def test_fine_coverage_by_hand() -> None:
    masks = torch.zeros(1, 4, 4, dtype=torch.long)  # 2x2 cells of 2 px; class 0 background
    masks[0, 0, 0] = 3  # object pixel in cell (0, 0): object and boundary
    masks[0, 2:, 2:] = 2  # cell (1, 1) all object: object, not boundary
    masks[0, 2, 0] = 255  # ignored pixel in cell (1, 0): still pure background
    is_object, boundary = cell_classes(masks, 2, 255, background=(0,))
    assert is_object.tolist() == [[[True, False], [False, True]]]
    assert boundary.tolist() == [[[True, False], [False, False]]]
    levels = Levels((4, 2))
    tokens = [torch.zeros(1, 1, 1, 3), torch.zeros(1, 2, 2, 3)]
    layout = build_layout(tokens, [torch.ones(1, 1, 1, dtype=torch.bool)], levels)  # all fine
    metric = FineCoverage(cell=2, background=(0,))
    metric.update(layout, masks)
    coarse = build_layout(tokens, [torch.zeros(1, 1, 1, dtype=torch.bool)], levels)
    metric.update(coarse, masks)
    values = metric.compute()
    assert values["object_fine_coverage"].item() == pytest.approx(0.5)
    assert values["boundary_fine_coverage"].item() == pytest.approx(0.5)


def test_thin_structure_coverage_by_hand() -> None:
    """Thin-structure cells (any pixel of a thin class) are their own column, reported only when the
    metric is told which classes are thin (the default twins' summaries keep their columns)."""
    masks = torch.zeros(1, 8, 8, dtype=torch.long)  # 4x4 cells of 2 px
    masks[0, 0, :] = 4  # a one-pixel line of thin class 4 along the top: cells (0, 0..3)
    masks[0, 6:, 6:] = 2  # a thick object in cell (3, 3)
    levels = Levels((4, 2))
    tokens = [torch.zeros(1, 2, 2, 3), torch.zeros(1, 4, 4, 3)]
    left_top = [torch.tensor([[[True, False], [False, False]]])]  # fine tokens on cells (0..1, 0..1)
    layout = build_layout(tokens, left_top, levels)
    metric = FineCoverage(cell=2, background=(0,), thin=(4,))
    metric.update(layout, masks)
    values = metric.compute()
    assert values["thin_fine_coverage"].item() == pytest.approx(2 / 4)
    assert values["object_fine_coverage"].item() == pytest.approx(2 / 5)
    plain = FineCoverage(cell=2, background=(0,))
    plain.update(layout, masks)
    assert "thin_fine_coverage" not in plain.compute()


def test_object_coverage_of_detection_boxes_and_masks_by_hand() -> None:
    from splitlab.metrics import instance_label_map

    # a 4x4-cell image of 2 px cells; one box over cells (0..1, 0..1), one mask in cell (3, 3)
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [6.0, 6.0, 8.0, 8.0]])
    labels = torch.tensor([2, 1])
    label_map = instance_label_map(boxes, labels, (8, 8))
    assert label_map[:4, :4].eq(2).all() and label_map[6:, 6:].eq(1).all() and label_map.sum() == 2 * 16 + 4
    masks = torch.zeros(2, 8, 8, dtype=torch.uint8)
    masks[0, 0:3, 0:3] = 1  # a mask inside its box: cell (1, 1) is then part object, part background
    masks[1, 6:, 6:] = 1
    from_masks = instance_label_map(boxes, labels, (8, 8), masks)
    assert from_masks[:3, :3].eq(2).all() and from_masks[3, 3] == 0
    levels = Levels((4, 2))
    tokens = [torch.zeros(1, 2, 2, 3), torch.zeros(1, 4, 4, 3)]
    split_top_left = [torch.tensor([[[True, False], [False, False]]])]  # fine tokens on the first box only
    layout = build_layout(tokens, split_top_left, levels)
    metric = FineCoverage(cell=2, ignore_index=-1, background=(0,))
    metric.update(layout, from_masks[None])
    values = metric.compute()
    # object cells: (0,0) (0,1) (1,0) (1,1) of the first mask and (3,3) of the second: 4 of 5 fine
    assert values["object_fine_coverage"].item() == pytest.approx(4 / 5)
    # boundary cells (object and background in one cell): (0,1) (1,0) (1,1); all fine
    assert values["boundary_fine_coverage"].item() == pytest.approx(1.0)


def test_the_ade20k_recipe_names_the_50_stuff_classes() -> None:
    import yaml

    from splitlab.heads.mmseg import import_mmseg
    from tests.helpers import REPO

    import_mmseg()
    from mmseg.datasets import ADE20KDataset

    recipe = yaml.safe_load((REPO / "tasks" / "ade20k.yaml").read_text())["model"]["init_args"]
    stuff = recipe["background_classes"]
    assert len(stuff) == len(set(stuff)) == 50 and all(0 <= c < 150 for c in stuff)
    # by name, in mmseg's order of the 150 classes (ids after reduce_zero_label): the stuff half of
    # the standard SceneParsing things/stuff split, with its own quirks (escalator, poster, shower...)
    names = ADE20KDataset.METAINFO["classes"]
    assert {names[c] for c in stuff} == set(ADE20K_STUFF)
    assert not {"person", "car", "chair", "table", "bed", "curtain", "fence"} & {names[c] for c in stuff}


ADE20K_STUFF = (  # noqa: SIM905  (fifty names read better as text)
    "wall building sky floor tree ceiling road grass sidewalk earth mountain plant water house sea rug field "
    "rock base sand skyscraper grandstand path runway stairway river bridge blind hill bar hovel tower "
    "land escalator buffet poster stage canopy tent cradle tank lake blanket pier shower waterfall"
).split() + ["dirt track", "conveyer belt", "swimming pool", "crt screen"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Two", "2"),  # lower-cased, number word -> digit
        ("the dog.", "dog"),  # article dropped, final period (no digit after it) removed
        ("3.5", "3.5"),  # a period followed by a digit is a decimal point and stays
        ("3.", "3"),  # no digit after it: not a decimal point
        ("yes!", "yes"),  # "!" not next to a space -> space, then split away
        ("dont know", "don't know"),  # contraction restored
        ("a red-and-white bus", "red and white bus"),  # "-" not next to a space -> space
        ("1,000", "1000"),  # comma between digits -> the comma is removed, not spaced
        ("red-white 1,5", "redwhite 15"),  # a digit comma anywhere removes every punctuation mark
        ("hello , world", "hello world"),  # "," next to a space -> removed
        ("  none\tof\nthem ", "0 of them"),  # tabs/newlines are spaces; "none" -> "0"
        ("I'm", "i'm"),  # already has its apostrophe: only lower-cased
        ("im", "im"),  # the official keys "Im", "Ive" are capitalised, words are lower-cased first: no match
        ("Ive", "ive"),
        ("youre", "you're"),
        ("isnt", "isn't"),
        ("couldnt've", "couldn't've"),  # one of two apostrophes missing: an official key
        # only the official table's spellings are restored, not every apostrophe-less one
        ("couldntve", "couldntve"),  # both missing: not an official key
        ("yallll", "yallll"),  # the official key is "y'allll"
        ("y'allll", "y'all'll"),
        ("hedve", "hedve"),  # the official keys are "hed've" and "he'dve"
        ("he'dve", "he'd've"),
        ("shes", "shes"),  # the official table has "she's" -> "she's" only
        ("she's", "she's"),
        ("hes", "he's"),
        ("somebody'd", "somebodyd"),  # the official table's quirk: the apostrophe is removed
        ("somebodyd", "somebodyd"),  # not a key
        ("shed", "shed"),  # an ordinary word, not "she'd" (not an official key)
        ("  dont\tknow ", "don't know"),  # the prediction is whitespace-cleaned first
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_period_strip_stops_after_32_like_the_official_script() -> None:
    # the official script passes re.UNICODE (== 32) as `count`, so only the first 32 periods go
    assert normalize_answer("x" + "." * 40) == "x" + "." * 8


# By hand: with k of the 10 answers equal to the prediction, holding out a matching answer leaves k - 1
# matches, holding out another leaves k; the score is (k * min(1, (k-1)/3) + (10-k) * min(1, k/3)) / 10.
# The answers differ, so every mode normalises the prediction "Red." to "red" and leaves "red" / "blue".
@pytest.mark.parametrize("mode", VQA_MODES)
@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        (3, 0.9),  # (3 * 2/3 + 7 * 1) / 10
        (2, 0.6),  # (2 * 1/3 + 8 * 2/3) / 10
        (1, 0.3),  # (1 * 0 + 9 * 1/3) / 10
        (0, 0.0),
    ],
)
def test_vqa_score_by_hand(matches: int, expected: float, mode: str) -> None:
    answers = ["red"] * matches + ["blue"] * (10 - matches)
    assert vqa_score("Red.", answers, mode=mode) == pytest.approx(expected)


# Each row by hand, per mode. The rules (splitlab.metrics, VQA_MODES):
#   official:  humans and prediction whitespace-cleaned; only if the ten cleaned humans differ, all
#              eleven get the full processing (else compared as cleaned: no lower-casing, no "two" -> "2");
#   2016:      prediction fully processed; humans as given, or punctuation step only when they differ;
#   lmms-eval: humans and prediction always cleaned and fully processed.
# Scores: k matches of 10 -> 10: 1.0, >= 4: 1.0, 3: 0.9, 2: 0.6, 1: 0.3, 0: 0.0 (test_vqa_score_by_hand).
GREEN = ["white", "blue", "Green.", "Green.", "Green.", "Green.", "Green.", "Green.", "green", "white"]


@pytest.mark.parametrize(
    ("prediction", "answers", "official", "v2016", "lmms"),
    [
        # humans differ. official and lmms-eval: "Green." -> "green" (period and case), so k = 7 -> 1.0.
        # 2016: punctuation step only, "Green." -> "Green" keeps its capital: only "green" matches, k = 1
        pytest.param("green", GREEN, 1.0, 0.3, 1.0, id="green"),
        # identical humans. official: nothing processed, "two" == "two", k = 10. 2016: the prediction
        # becomes "2", the humans stay "two", k = 0. lmms-eval: all become "2", k = 10
        pytest.param("two", ["two"] * 10, 1.0, 0.0, 1.0, id="two-vs-two"),
        # official: identical humans, the raw "two" != "2". 2016 and lmms-eval: "two" -> "2", k = 10
        pytest.param("two", ["2"] * 10, 0.0, 1.0, 1.0, id="two-vs-2"),
        # official: identical, "Red." != "red" raw. 2016 and lmms-eval: "Red." -> "red", k = 10
        pytest.param("Red.", ["red"] * 10, 0.0, 1.0, 1.0, id="Red.-vs-red"),
        # humans differ. official and lmms-eval: " 2" cleaned, "2." -> "2", "two" -> "2": k = 5.
        # 2016: punctuation only: "2." -> "2", "two" stays, " 2" keeps its space: k = 3
        pytest.param("2", ["2.", "2", "2", "two", " 2"] + ["blue"] * 5, 1.0, 0.9, 1.0, id="2-mixed"),
        pytest.param("green", ["2.", "2", "2", "two", " 2"] + ["blue"] * 5, 0.0, 0.0, 0.0, id="no-match"),
        # contractions: "somebody'd" -> "somebodyd" (the official table). official: identical humans,
        # compared raw; 2016: only the prediction changes; lmms-eval: both change
        pytest.param("somebody'd", ["somebody'd"] * 10, 1.0, 0.0, 1.0, id="somebody'd"),
        pytest.param("somebody'd", ["somebodyd"] * 10, 0.0, 1.0, 1.0, id="somebodyd"),
        pytest.param("shes", ["shes"] * 10, 1.0, 1.0, 1.0, id="shes"),  # no official key: unchanged
        # whitespace: every mode cleans the prediction's
        pytest.param(" yes\n", ["yes"] * 10, 1.0, 1.0, 1.0, id="prediction-whitespace"),
        # humans with trailing spaces / newlines. official and lmms-eval clean them: ten "yes", k = 10.
        # 2016 never cleans a human: "yes\n" and "yes " (punctuation step only) never equal "yes"
        pytest.param("yes", ["yes\n"] * 5 + ["yes "] * 5, 1.0, 0.0, 1.0, id="human-whitespace"),
        pytest.param("yes", [" yes\n"] * 10, 1.0, 0.0, 1.0, id="human-whitespace-identical"),
        # 2016: " yes" keeps its space, k = 2 -> 0.6; official: cleaned they are identical, k = 10
        pytest.param("yes", [" yes"] * 8 + ["yes"] * 2, 1.0, 0.6, 1.0, id="human-space-8-of-10"),
        # official: once cleaned the humans are identical, so "Yes" is compared raw with "yes": k = 0
        # (2016: humans uncleaned, k = 0; lmms-eval lower-cases all, k = 10)
        pytest.param("Yes", ["yes\n"] * 5 + ["yes "] * 5, 0.0, 0.0, 1.0, id="cleaned-identical-case"),
        # official: cleaned humans still differ ("yes" / "Yes"): all processed, k = 10. 2016: "yes "
        # keeps its space, "Yes" its capital, the prediction is "yes": k = 0
        pytest.param("Yes", ["yes "] * 9 + ["Yes"], 1.0, 0.0, 1.0, id="cleaned-differ-case"),
        # official: tab -> space in all, humans differ: "red car" x 9, k = 9. 2016: the humans' tab stays
        pytest.param("red\tcar", ["red\tcar"] * 9 + ["car"], 1.0, 0.0, 1.0, id="human-tab"),
        # the one processing difference: "1,,2" holds a run of commas between digits. lmms-eval's test
        # (a run) sees a digit comma, so all punctuation goes: "12", k = 5. The official test (exactly
        # one comma) does not: the commas become spaces, "1 2" (official), "1  2" (2016: not split)
        pytest.param("12", ["1,,2"] * 5 + ["3"] * 5, 0.0, 0.0, 1.0, id="commas-12"),
        pytest.param("1 2", ["1,,2"] * 5 + ["3"] * 5, 1.0, 0.0, 0.0, id="commas-1-2"),
    ],
)
def test_vqa_score_modes_by_hand(
    prediction: str, answers: list[str], official: float, v2016: float, lmms: float
) -> None:
    expected = {"official": official, "2016": v2016, "lmms-eval": lmms}
    for mode, value in expected.items():
        assert vqa_score(prediction, answers, mode=mode) == pytest.approx(value), mode
    assert vqa_score(prediction, answers) == pytest.approx(official)  # the default


def test_vqa_score_2016_leaves_identical_answers_raw() -> None:
    # the 2016 script does not normalise identical human answers; the prediction "two" becomes "2"
    assert vqa_score("two", ["two"] * 10, mode="2016") == 0.0
    # all ten "somebody'd": the prediction becomes "somebodyd" (official table), they stay
    assert vqa_score("somebody'd", ["somebody'd"] * 10, mode="2016") == 0.0
    assert vqa_score("somebody'd", ["somebodyd"] * 10, mode="2016") == pytest.approx(1.0)
    assert vqa_score("Red.", ["red"] * 10, mode="2016") == pytest.approx(1.0)  # k = 10


def test_vqa_score_2016_cleans_whitespace_of_the_prediction_only() -> None:
    # the 2016 script cleans tabs, newlines and outer spaces from the prediction ...
    assert vqa_score(" yes\n", ["yes"] * 10, mode="2016") == pytest.approx(1.0)
    # ... but never from a human answer: ten identical " yes\n" are compared as given -> 0
    assert vqa_score("yes", [" yes\n"] * 10, mode="2016") == 0.0
    # differing answers: the punctuation step keeps the space of " yes", so k = 2 of the 10 match "yes";
    # (2 * 1/3 + 8 * 2/3) / 10 = 0.6
    assert vqa_score("yes", [" yes"] * 8 + ["yes"] * 2, mode="2016") == pytest.approx(0.6)
    # a tab inside a human answer stays a tab (the prediction's becomes a space) -> no match
    assert vqa_score("red\tcar", ["red\tcar"] * 9 + ["car"], mode="2016") == 0.0


@pytest.mark.parametrize("count", [9, 11])
def test_vqa_score_needs_ten_answers(count: int) -> None:
    with pytest.raises(ValueError, match=f"10 human answers, got {count}"):
        vqa_score("yes", ["yes"] * count)


def test_vqa_mode_unknown_is_refused() -> None:
    allowed = r"'official', '2016', 'lmms-eval'"
    with pytest.raises(ValueError, match=rf"mode='2021'.*vqa_accuracy_mode.*{allowed}"):
        vqa_score("yes", ["yes"] * 10, mode="2021")
    with pytest.raises(ValueError, match=rf"mode='Official'.*{allowed}"):
        VQAAccuracy(mode="Official")


def test_metric_scores_in_its_mode() -> None:
    # "two" against ten "two" (test_vqa_score_modes_by_hand): 1.0 official, 0.0 in 2016, 1.0 lmms-eval
    for mode, expected in (("official", 1.0), ("2016", 0.0), ("lmms-eval", 1.0)):
        metric = VQAAccuracy(mode=mode)
        metric.update(["two"], [["two"] * 10], ["number"])
        assert metric.compute()["vqa_accuracy"].item() == expected, mode
    assert VQAAccuracy().mode == "official"


def test_vqa_task_passes_its_mode_to_the_metric(tmp_path) -> None:
    from tests.tasks.test_vqa import task_with

    assert task_with(tmp_path).build_metrics()["vqa"].mode == "official"
    assert task_with(tmp_path, vqa_accuracy_mode="2016").build_metrics()["vqa"].mode == "2016"
    with pytest.raises(ValueError, match="vqa_accuracy_mode"):
        task_with(tmp_path, vqa_accuracy_mode="2017")


def _batch() -> tuple[list[str], list[list[str]], list[str], list[str]]:
    # per question, score by hand (see test_vqa_score_by_hand for the k -> score rule)
    predictions = ["yes", "no", "two", "red", "3"]
    answers = [
        ["yes"] * 10,  # 1.0
        ["yes"] * 10,  # 0.0
        ["2"] * 3 + ["3"] * 7,  # k = 3 -> 0.9
        ["red"] * 2 + ["blue"] * 8,  # k = 2 -> 0.6
        ["3"] * 1 + ["4"] * 9,  # k = 1 -> 0.3
    ]
    answer_types = ["yes/no", "yes/no", "number", "other", "number"]
    question_types = ["is the", "is the", "how many", "what color is the", "how many"]
    return predictions, answers, answer_types, question_types


def test_metric_by_answer_and_question_type() -> None:
    metric = VQAAccuracy(question_types=("is the", "how many", "what is the"))
    metric.update(*_batch())
    values = metric.compute()
    expected = {
        "vqa_accuracy": (1.0 + 0.0 + 0.9 + 0.6 + 0.3) / 5,  # 0.56, a fraction, not percent
        "vqa_yes_no": (1.0 + 0.0) / 2,
        "vqa_number": (0.9 + 0.3) / 2,
        "vqa_other": 0.6,
        "vqa_q_is_the": (1.0 + 0.0) / 2,
        "vqa_q_how_many": (0.9 + 0.3) / 2,
    }
    # "what color is the" is not tracked: it counts overall and as "other" only
    assert set(values) == {*expected, "vqa_q_what_is_the"}
    for key, value in expected.items():
        assert values[key].item() == pytest.approx(value), key
    assert math.isnan(values["vqa_q_what_is_the"].item())  # tracked, never seen
    assert all(v.dim() == 0 for v in values.values())


def test_metric_empty_answer_type_is_nan() -> None:
    metric = VQAAccuracy()
    metric.update(["yes"], [["yes"] * 10], ["yes/no"])
    values = metric.compute()
    assert values["vqa_yes_no"].item() == 1.0 and values["vqa_accuracy"].item() == 1.0
    assert math.isnan(values["vqa_number"].item()) and math.isnan(values["vqa_other"].item())
    assert not any(k.startswith("vqa_q_") for k in values)


def test_metric_rejects_bad_input() -> None:
    metric = VQAAccuracy()
    with pytest.raises(ValueError, match=r"'maybe'.*yes/no.*number.*other"):
        metric.update(["yes"], [["yes"] * 10], ["maybe"])
    with pytest.raises(ValueError, match="10 human answers, got 3"):
        metric.update(["yes"], [["yes"] * 3], ["yes/no"])
    with pytest.raises(ValueError, match="2 predictions"):
        metric.update(["yes", "no"], [["yes"] * 10], ["yes/no", "yes/no"])
    with pytest.raises(ValueError, match="collide"):
        VQAAccuracy(question_types=("how many", "how-many"))  # both would be "vqa_q_how_many"


def test_metric_halves_merged_equal_the_whole() -> None:
    predictions, answers, answer_types, question_types = _batch()
    tracked = ("is the", "how many", "what color is the")
    whole = VQAAccuracy(question_types=tracked)
    whole.update(predictions, answers, answer_types, question_types)
    first, second = VQAAccuracy(question_types=tracked), VQAAccuracy(question_types=tracked)
    first.update(predictions[:2], answers[:2], answer_types[:2], question_types[:2])
    second.update(predictions[2:], answers[2:], answer_types[2:], question_types[2:])
    # what a DDP all-reduce does: every state is a sum of the processes' states
    for name in whole._defaults:
        torch.testing.assert_close(getattr(first, name) + getattr(second, name), getattr(whole, name))
    first.merge_state(second)
    merged, expected = first.compute(), whole.compute()
    assert merged.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key], equal_nan=True)
    assert merged["vqa_yes_no"].item() == pytest.approx(0.5)  # only in the first half
    assert merged["vqa_number"].item() == pytest.approx(0.6)  # only in the second half


# COCO box mAP as the detection task evaluates it, against pycocotools' COCOeval


def _hand_made_detections():
    t = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    i = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    targets = [
        {"boxes": t([[10, 10, 60, 60], [100, 100, 220, 230], [150, 20, 170, 40]]), "labels": i([1, 2, 3])},
        {"boxes": t([[30, 30, 90, 80], [120, 40, 160, 100]]), "labels": i([1, 1])},
        {"boxes": t([[0, 0, 250, 250]]), "labels": i([2])},
        {"boxes": t([]).reshape(0, 4), "labels": i([])},
    ]
    preds = [
        {
            "boxes": t([[12, 12, 58, 62], [105, 95, 215, 225], [5, 5, 40, 40], [150, 20, 171, 41]]),
            "scores": t([0.9, 0.8, 0.3, 0.6]),
            "labels": i([1, 2, 1, 3]),
        },
        {
            "boxes": t([[32, 28, 88, 85], [31, 31, 89, 79], [200, 200, 240, 240]]),
            "scores": t([0.7, 0.65, 0.5]),
            "labels": i([1, 1, 3]),
        },
        {"boxes": t([]).reshape(0, 4), "scores": t([]), "labels": i([])},
        {"boxes": t([[50, 50, 100, 100]]), "scores": t([0.95]), "labels": i([2])},
    ]
    return targets, preds


def _cocoeval(targets, preds, crowd=()) -> list[float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, anns, dets = [], [], []
    for img_id, (tg, pr) in enumerate(zip(targets, preds, strict=True)):
        images.append({"id": img_id, "height": 256, "width": 256})
        for j, ((x1, y1, x2, y2), c) in enumerate(
            zip(tg["boxes"].tolist(), tg["labels"].tolist(), strict=True)
        ):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": img_id,
                    "category_id": c,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": int((img_id, j) in crowd),
                }
            )
        for (x1, y1, x2, y2), c, s in zip(
            pr["boxes"].tolist(), pr["labels"].tolist(), pr["scores"].tolist(), strict=True
        ):
            dets.append(
                {"image_id": img_id, "category_id": c, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": s}
            )
    gt = COCO()
    gt.dataset = {
        "info": {},
        "images": images,
        "annotations": anns,
        "categories": [{"id": c, "name": str(c)} for c in (1, 2, 3)],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(dets), iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats.tolist()


def test_detection_map_equals_cocoeval() -> None:
    targets, preds = _hand_made_detections()
    metric = detection_metrics()["map"]  # the metric a DetectionTask evaluates with
    metric.update(preds, targets)
    ours = metric.compute()
    stats = _cocoeval(targets, preds)
    for key, index in (("map", 0), ("map_50", 1), ("map_75", 2)):
        assert ours[key].item() == pytest.approx(stats[index], abs=1e-6), key
    assert 0 < ours["map"].item() < 1


def test_detections_on_a_crowd_are_ignored_as_cocoeval_does() -> None:
    """Crowd regions flagged in the targets (as the COCO data gives them): mAP equals pycocotools'
    with iscrowd=1; counting the crowd as an instance, or dropping it, gives other numbers."""
    targets, preds = _hand_made_detections()
    crowd = {(0, 1), (1, 1)}  # the second box of the first two images is a crowd region
    for img, tg in enumerate(targets):
        tg["iscrowd"] = torch.tensor([int((img, j) in crowd) for j in range(len(tg["labels"]))])
        tg["area"] = (tg["boxes"][:, 2] - tg["boxes"][:, 0]) * (tg["boxes"][:, 3] - tg["boxes"][:, 1])
    metric = detection_metrics()["map"]
    metric.update(preds, [coco_truth(t) for t in targets])
    ours = metric.compute()["map"].item()
    assert ours == pytest.approx(_cocoeval(targets, preds, crowd)[0], abs=1e-6)
    assert ours != pytest.approx(_cocoeval(targets, preds)[0], abs=1e-3)
    dropped = [without_crowd(t) for t in targets]  # what the detector trains on
    assert [len(t["labels"]) for t in dropped] == [2, 1, 1, 0] and not any(
        t["iscrowd"].any() for t in dropped
    )


def test_timed_reads_the_blocks_seconds_once_it_has_ended() -> None:
    """The one timer of evaluation and `splitlab bench`: 0.0 inside the block, its wall time after."""
    import time

    with timed(torch.device("cpu")) as elapsed:
        time.sleep(0.02)
        assert elapsed() == 0.0
    assert 0.02 <= elapsed() < 5.0
