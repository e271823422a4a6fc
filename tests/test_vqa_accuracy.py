"""VQA accuracy: answer normalisation, per-question scores and the metric, all worked by hand.

Expected values follow the official VQAv2 rules (GT-Vision-Lab `vqaEval.py`): a question scores the mean,
over the ten ways to hold out one human answer, of ``min(1, matches among the other nine / 3)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from splitlab.metrics import VQAAccuracy, normalize_answer, vqa_score


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
        ("couldnt've", "couldn't've"),  # one of two apostrophes missing
        ("couldntve", "couldn't've"),  # both missing
        ("yallll", "y'all'll"),
        ("shed", "shed"),  # an ordinary word, not "she'd" (the official table leaves it too)
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_period_strip_stops_after_32_like_the_official_script() -> None:
    # the official script passes re.UNICODE (== 32) as `count`, so only the first 32 periods go
    assert normalize_answer("x" + "." * 40) == "x" + "." * 8


# By hand: with k of the 10 answers equal to the prediction, holding out a matching answer leaves k - 1
# matches, holding out another leaves k; the score is (k * min(1, (k-1)/3) + (10-k) * min(1, k/3)) / 10.
@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        (10, 1.0),  # 10 * 1 / 10
        (3, 0.9),  # (3 * 2/3 + 7 * 1) / 10
        (2, 0.6),  # (2 * 1/3 + 8 * 2/3) / 10
        (1, 0.3),  # (1 * 0 + 9 * 1/3) / 10
        (0, 0.0),
    ],
)
def test_vqa_score_by_hand(matches: int, expected: float) -> None:
    answers = ["red"] * matches + ["blue"] * (10 - matches)
    assert vqa_score("Red.", answers) == pytest.approx(expected)


def test_vqa_score_normalises_prediction_and_answers() -> None:
    # ten identical "2": the prediction "two" normalises to "2" and matches all -> 1
    assert vqa_score("two", ["2"] * 10) == pytest.approx(1.0)
    # differing human answers get only whitespace cleaning and the punctuation step: " 2" and "2." become
    # "2", but "two" stays "two" (official); 3 of the 10 match the prediction "2" -> 0.9 (raw: 0.3)
    answers = [" 2", "2.", "2"] + ["two"] + ["blue"] * 6
    assert vqa_score("2", answers) == pytest.approx(0.9)
    # a prediction matching nothing scores 0
    assert vqa_score("green", answers) == 0.0


def test_vqa_score_leaves_identical_answers_raw_like_the_official_script() -> None:
    # all ten "two": the official script does not normalise identical answers, the prediction becomes "2"
    assert vqa_score("two", ["two"] * 10) == 0.0
    # but surrounding whitespace is cleaned from them
    assert vqa_score("yes", [" yes\n"] * 10) == pytest.approx(1.0)


@pytest.mark.parametrize("count", [9, 11])
def test_vqa_score_needs_ten_answers(count: int) -> None:
    with pytest.raises(ValueError, match=f"10 human answers, got {count}"):
        vqa_score("yes", ["yes"] * count)


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
