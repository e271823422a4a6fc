"""Each model's head settings as one frozen dataclass: what config.json's ``head`` holds.

The model builds its head from its dataclass (read by field, never by scanning a signature), the
task's code reads the class count from the model, and each task class's signature takes its
defaults from here: every default of a head is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, TypeVar

from splitlab.heads import PYRAMID_CHANNELS
from splitlab.heads.detection import DetectorSettings
from splitlab.heads.vqa import PROMPT

# the LLaVA-1.5 checkpoint whose LM, projector and tokenizer a VQA model reads by default
LLAVA = "llava-hf/llava-1.5-7b-hf"


def _ints(values: Any) -> list[int] | None:
    """A recipe's list (or tuple) of ints as config.json keeps it; None stays None."""
    return None if values is None else [int(v) for v in values]


@dataclass(frozen=True)
class NoSettings:
    """No settings of its own: a model's head that has none, a task's code that reads none."""


@dataclass(frozen=True)
class ClassificationHeadSettings:
    """`SplitClassifier`'s head: the timm model's own.

    Attributes:
        num_classes: classes; None keeps the timm model's head.
        global_pool: one of `splitlab.model.tasks.POOLS`; None keeps the model's.
    """

    num_classes: int | None = None
    global_pool: str | None = None


@dataclass(frozen=True)
class PyramidHeadSettings:
    """A dense head's feature pyramid (`splitlab.heads.SimpleFeaturePyramid`).

    Attributes:
        pyramid_channels: channels of the feature pyramid.
        pyramid_indices: blocks feeding the pyramid levels (1 or 4; None: 4 evenly spaced).
    """

    pyramid_channels: int = PYRAMID_CHANNELS
    pyramid_indices: list[int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "pyramid_channels", int(self.pyramid_channels))
        object.__setattr__(self, "pyramid_indices", _ints(self.pyramid_indices))


@dataclass(frozen=True)
class DetectionHeadSettings(PyramidHeadSettings):
    """`SplitDetector`'s head: the pyramid's settings and these.

    Attributes:
        num_classes: object categories (background excluded).
        detector: the torchvision detector, its anchors and box head (`DetectorSettings`).
        category_ids: the dataset's id of labels 1..K (COCO results files); set from the data.
    """

    num_classes: int = 80
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    category_ids: list[int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "num_classes", int(self.num_classes))
        object.__setattr__(self, "detector", settings_of(DetectorSettings, self.detector, "detector"))
        object.__setattr__(self, "category_ids", _ints(self.category_ids))


@dataclass(frozen=True)
class SegmentationHeadSettings(PyramidHeadSettings):
    """`SplitSegmenter`'s head: the pyramid's settings and these.

    Attributes:
        num_classes: classes (150 for ADE20K).
        decode_head: mmseg head config overriding UPerHead's defaults.
        auxiliary_head: mmseg head config for an auxiliary head (``{}``: an FCN head on level 2),
            None for none.
    """

    num_classes: int = 150
    decode_head: dict[str, Any] | None = None
    auxiliary_head: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "num_classes", int(self.num_classes))


@dataclass(frozen=True)
class VQAHeadSettings:
    """`SplitVQA`'s head: projector and language model.

    Attributes:
        lm: a hub name or local folder (a LLaVA checkpoint gives its LM and projector), or a config
            dict (``model_type`` and its settings) for a random-init LM.
        lm_tokenizer: the LM's tokenizer: a hub name / folder, or a ``vocab.json`` word list.
        prompt: the prompt template, with ``<image>`` and ``{question}`` (LLaVA-1.5's VQA turn).
        feature_block: the ViT block whose tokens become visual tokens (negative: from the end).
        token_order: ``raster`` (what the LM was trained on) or ``layout``.
        raster_anchor: the cell that places a coarse token in raster order: ``corner`` or ``centre``.
        max_new_tokens: longest generated answer.
        train_lm: the LM is fine-tuned too (float32, saved).
        lora: `peft.LoraConfig` settings of adapters trained on the frozen LM; None for none.
    """

    lm: str | dict[str, Any] = LLAVA
    lm_tokenizer: str = LLAVA
    prompt: str = PROMPT
    feature_block: int = -2
    token_order: str = "raster"
    raster_anchor: str = "corner"
    max_new_tokens: int = 8
    train_lm: bool = False
    lora: dict[str, Any] | None = None


@dataclass(frozen=True)
class MultiTaskHeadSettings:
    """`SplitMultiTask`'s heads.

    Attributes:
        tasks: task name -> that task's settings: ``task`` (``detection`` or ``segmentation``), its
            head's settings as its own model takes them, and its ``names``.
    """

    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)


S = TypeVar("S")


def settings_of(cls: type[S], given: Any, where: str) -> S:
    """``given`` as ``cls``: the dataclass itself, a mapping of its fields (a recipe's, a config's),
    or None for the defaults; an unknown field is named with ``where``."""
    if isinstance(given, cls):
        return replace(given)  # runs its checks again
    if given is None:
        return cls()
    if is_dataclass(given) and not isinstance(given, type):  # another dataclass: its fields, by name
        given = asdict(given)
    if not isinstance(given, Mapping):
        raise ValueError(f"{where}: expected a mapping of {cls.__name__}'s fields, got {given!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"{where}: unknown settings {unknown}; {cls.__name__} has {sorted(known)}")
    return cls(**given)


def picked(cls: type[S], given: Mapping[str, Any]) -> S:
    """The fields of ``cls`` that ``given`` (a task's settings, a multi-task entry) sets, the
    dataclass's defaults for the rest: what of a task's settings its head reads."""
    return settings_of(cls, {f.name: given[f.name] for f in fields(cls) if f.name in given}, cls.__name__)


def head_config(settings: Any) -> dict[str, Any]:
    """A head's settings as config.json's ``head`` holds them (nested settings as mappings)."""
    return asdict(settings)
