"""VQAv2 answer accuracy: the official answer normalisation, the per-answer score and `VQAAccuracy`.

The VQAv2 constants that the data reader checks files against (`VQA_ANSWER_TYPES`,
`ANSWERS_PER_QUESTION`) are defined here and imported by `splitlab.data.vqa` (data may import
metrics, not the reverse), so that what is read and what is scored cannot disagree. Three
normalisations are reproduced (`VQA_MODES`): today's official script (the evaluation server's), its
2016 version, and lmms-eval's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

# VQAv2's answer types, in the order of `VQAAccuracy`'s per-type states.
VQA_ANSWER_TYPES = ("yes/no", "number", "other")
# Human answers per question in VQAv2; the accuracy leaves each one out in turn.
ANSWERS_PER_QUESTION = 10

# VQA accuracy (VQAv2 evaluation rules). Answers are free text, so the official evaluation first
# normalises them; the tables below are that normalisation's data.

_VQA_PUNCTUATION = (
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
)
_VQA_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
# The official pattern: `(?!<=\d)` is a lookahead for the text "<=digit", not a lookbehind, so only the
# `(?!\d)` part acts: a period is removed unless a digit follows it ("3.5" and ".5" keep theirs).
_VQA_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
# The official script passes `re.UNICODE` (32) where `sub` takes its count, so at most 32 periods go.
_VQA_PERIOD_MAX = int(re.UNICODE)
_VQA_NUMBERS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_VQA_ARTICLES = frozenset({"a", "an", "the"})
# The official contractions table, entry for entry: GT-Vision-Lab/VQA,
# PythonEvaluationTools/vqaEvaluation/vqaEval.py (`VQAEval.contractions`). Its quirks are kept on purpose,
# because scores must match the official evaluation server's: only the listed spellings are restored
# ("shes", "couldntve" and "shed" stay as written); "somebody'd" becomes "somebodyd"; a few keys keep
# an apostrophe ("let's" and "she's" map to themselves); and the capitalised keys ("Im", "Ive", "Id've",
# "I'dve") never match, since words are looked up after lower-casing.
# fmt: off
_VQA_CONTRACTIONS: dict[str, str] = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's",
    "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm",
    "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll",
    "let's": "let's", "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've",
    "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've",
    "she'dve": "she'd've", "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've",
    "someone'dve": "someone'd've", "someonell": "someone'll", "someones": "someone's",
    "somethingd": "something'd", "somethingd've": "something'd've", "something'dve": "something'd've",
    "somethingll": "something'll", "thats": "that's", "thered": "there'd", "thered've": "there'd've",
    "there'dve": "there'd've", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're",
    "theyve": "they've", "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's", "whereve": "where've",
    "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've",
    "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll", "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've",
    "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}
# fmt: on


def _vqa_clean(answer: str) -> str:
    return answer.replace("\n", " ").replace("\t", " ").strip()


def _vqa_punctuation(text: str, comma: re.Pattern[str] = _VQA_COMMA_STRIP) -> str:
    # Both tests look at the text as given, not as earlier characters left it (as the official script).
    comma_number = comma.search(text) is not None
    out = text
    for p in _VQA_PUNCTUATION:
        drop = comma_number or p + " " in text or " " + p in text
        out = out.replace(p, "" if drop else " ")
    return _VQA_PERIOD_STRIP.sub("", out, count=_VQA_PERIOD_MAX)


def _vqa_digit_article(text: str) -> str:
    words = [_VQA_NUMBERS.get(w, w) for w in text.lower().split()]
    return " ".join(_VQA_CONTRACTIONS.get(w, w) for w in words if w not in _VQA_ARTICLES)


def normalize_answer(answer: str) -> str:
    """The official VQA answer processing, so that "Two", "two." and "2" all score as "2".

    Whitespace is cleaned, punctuation removed or turned into spaces, periods that are not decimal
    points removed; then the text is lower-cased, number words become digits, articles go and the
    spellings listed in the official contractions table are replaced ("dont" -> "don't").
    """
    return _vqa_digit_article(_vqa_punctuation(_vqa_clean(answer)))


# Which evaluation `vqa_score` reproduces (the VQA task's ``vqa_accuracy_mode``):
# - "official": GT-Vision-Lab/VQA's vqaEval.py since a013f00 ("Fixed processing answers bug", 2021), what
#   the evaluation server runs today, hence the default. Humans and prediction are whitespace-cleaned;
#   only if the ten cleaned humans differ do all eleven get the full processing (so "Yes" does not match
#   ten "yes", and "two" matches ten "two").
# - "2016": the same script as of 458a8b2 (2016): the prediction always gets the full processing, the
#   humans are compared as given, or after the punctuation step alone when they differ (so "two" never
#   matches ten "two", and " yes" never matches).
# - "lmms-eval": EvolvingLMMs-Lab/lmms-eval's vqav2 task (since 28ea9a1, 2025): humans and prediction
#   always cleaned and fully processed, with the same tables; only its digit-comma test differs, also
#   accepting a run of commas ("1,,2" loses all punctuation).
VQA_MODES = ("official", "2016", "lmms-eval")
_LMMS_COMMA = re.compile(r"\d,+\d")


def _lmms_answer(answer: str) -> str:
    return _vqa_digit_article(_vqa_punctuation(_vqa_clean(answer), _LMMS_COMMA))


def check_vqa_mode(mode: str) -> str:
    """``mode`` if it is one of `VQA_MODES`, else a ValueError naming the setting."""
    if mode not in VQA_MODES:
        raise ValueError(f"VQA accuracy mode={mode!r} (vqa_accuracy_mode): expected one of {VQA_MODES}")
    return mode


def vqa_score(prediction: str, answers: Sequence[str], mode: str = "official") -> float:
    """VQA accuracy of one answer: ``min(1, matches / 3)`` averaged over the ten ways to leave out a human.

    Three matching humans give full credit; averaging over held-out humans makes the score consistent
    with human accuracy. Answers are normalised first, as ``mode`` says (`VQA_MODES`).

    Args:
        prediction: the model's answer.
        answers: the ten human answers.
        mode: ``"official"`` (today's official script), ``"2016"`` or ``"lmms-eval"``.
    """
    check_vqa_mode(mode)
    if len(answers) != ANSWERS_PER_QUESTION:
        raise ValueError(
            f"VQA accuracy needs exactly {ANSWERS_PER_QUESTION} human answers, got {len(answers)}"
        )
    if mode == "official":
        truth, pred = [_vqa_clean(a) for a in answers], _vqa_clean(prediction)
        if len(set(truth)) > 1:
            truth, pred = [normalize_answer(a) for a in truth], normalize_answer(pred)
    elif mode == "2016":
        truth, pred = list(answers), normalize_answer(prediction)
        if len(set(truth)) > 1:
            truth = [_vqa_punctuation(a) for a in truth]
    else:
        truth, pred = [_lmms_answer(a) for a in answers], _lmms_answer(prediction)
    matches = [a == pred for a in truth]
    total = sum(matches)
    return sum(min(1.0, (total - m) / 3) for m in matches) / len(matches)


class VQAAccuracy(Metric):
    """VQA accuracy overall, per answer type and per tracked question type, as fractions in [0, 1].

    Question types are free strings, so only those given to the constructor get a slot: the states
    keep a fixed shape and sum across processes. An empty category computes to NaN.

    Args:
        question_types: question types to report (e.g. ``"what color is the"``), each as
            ``"vqa_q_<type>"`` with non-alphanumerics replaced by ``_``.
        mode: the answer normalisation (`vqa_score`): ``"official"``, ``"2016"`` or ``"lmms-eval"``.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, question_types: Sequence[str] = (), mode: str = "official", **kwargs) -> None:
        super().__init__(**kwargs)
        self.mode = check_vqa_mode(mode)
        self.question_types = tuple(question_types)
        self._question_index = {q: i for i, q in enumerate(self.question_types)}
        self._question_keys = [f"vqa_q_{re.sub(r'[^0-9A-Za-z]', '_', q)}" for q in self.question_types]
        if len(self._question_index) != len(self.question_types):
            raise ValueError(f"question types repeat: {self.question_types}")
        if len(set(self._question_keys)) != len(self._question_keys):
            raise ValueError(f"question types {self.question_types} collide as keys {self._question_keys}")
        # float64: a sum over hundreds of thousands of multiples of 1/30 would drift in float32
        for name, size in (
            ("total", ()),
            ("by_answer", (len(VQA_ANSWER_TYPES),)),
            ("by_question", (len(self.question_types),)),
        ):
            self.add_state(f"{name}_score", torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state(f"{name}_count", torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self,
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        answer_types: Sequence[str],
        question_types: Sequence[str] | None = None,
    ) -> None:
        n = len(predictions)
        if (
            len(answers) != n
            or len(answer_types) != n
            or (question_types is not None and len(question_types) != n)
        ):
            raise ValueError(
                f"one answer list, answer type and question type per prediction: {n} predictions, "
                f"{len(answers)} answer lists, {len(answer_types)} answer types"
                + ("" if question_types is None else f", {len(question_types)} question types")
            )
        for t in answer_types:
            if t not in VQA_ANSWER_TYPES:
                raise ValueError(f"unknown VQA answer type {t!r}; expected one of {VQA_ANSWER_TYPES}")
        scores = [vqa_score(p, a, self.mode) for p, a in zip(predictions, answers, strict=True)]
        device = self.total_score.device
        values = torch.tensor(scores, dtype=torch.float64, device=device)
        self.total_score += values.sum()
        self.total_count += n
        index = torch.tensor(
            [VQA_ANSWER_TYPES.index(t) for t in answer_types], dtype=torch.long, device=device
        )
        self.by_answer_score.index_add_(0, index, values)
        self.by_answer_count.index_add_(0, index, torch.ones_like(values))
        if question_types is not None and self.question_types:
            tracked = [
                (i, self._question_index[q])
                for i, q in enumerate(question_types)
                if q in self._question_index
            ]
            if tracked:
                rows, slots = (
                    torch.tensor(x, dtype=torch.long, device=device) for x in zip(*tracked, strict=True)
                )
                self.by_question_score.index_add_(0, slots, values[rows])
                self.by_question_count.index_add_(0, slots, torch.ones_like(values[rows]))

    def compute(self) -> dict[str, Tensor]:
        def mean(score: Tensor, count: Tensor) -> Tensor:
            return torch.where(count > 0, score / count.clamp(min=1), torch.full_like(score, torch.nan))

        total = mean(self.total_score, self.total_count)
        by_answer = mean(self.by_answer_score, self.by_answer_count)
        by_question = mean(self.by_question_score, self.by_question_count)
        out = {"vqa_accuracy": total}
        for i, t in enumerate(VQA_ANSWER_TYPES):
            out["vqa_" + re.sub(r"[^0-9A-Za-z]", "_", t)] = by_answer[i]
        for i, key in enumerate(self._question_keys):
            out[key] = by_question[i]
        return out
