"""A task's settings, grouped as `PPOConfig` groups PPO's: what each stage and each part reads.

Each group is a dataclass with its defaults and its checks: a recipe writes a group as a mapping
(``warm_start: {label_source: annotations}``), Python passes the dataclass or the same mapping, and
LightningCLI shows every field as ``--model.init_args.<group>.<field>``. A field keeps the name the
quantity has everywhere else (``levels``, ``decision_dim`` in config.json; ``eval_budgets`` in
``splitlab curve``), so one name holds from YAML to files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, TypeVar

from splitlab.tokenizer import BASELINES, DECISION_CONTEXTS, DECISION_DIM, DECISION_HEADS
from splitlab.tokenizer.baselines import APT_SEARCHES

# the oracles read the targets (``oracle``: the annotations' cells; ``loss_oracle``: each split's worth
# to the task loss): rows of the evaluation, never a deployed policy
EVAL_BASELINES = (*BASELINES, "oracle", "loss_oracle")
LABEL_TARGETS = ("initial", "live")
LABEL_SOURCES = ("embedding", "annotations", "loss", "fidelity", "entropy")


def check_ranges(
    group: str, settings: Any, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()
) -> None:
    """Refuse a field out of its range before anything is built, named as the command line takes it."""
    for name in (*positive, *non_negative):
        value = getattr(settings, name)
        low_ok = value > 0 if name in positive else value >= 0
        if not (isinstance(value, int | float) and low_ok and math.isfinite(value)):
            bound = "above 0" if name in positive else "at least 0"
            raise ValueError(f"model.init_args.{group}.{name}={value!r}: must be a finite number {bound}")


@dataclass(frozen=True)
class TokenizerSettings:
    """The tokenizer: its levels and its decision module (config.json's names).

    Attributes:
        levels: patch sizes coarse to fine; None: up to 3 levels that divide the image.
        decision_dim: width of the decision module.
        decision_heads: heads of its cross-attention.
        decision_context: what a patch's decision reads: its ``children`` (the paper's) or its
            ``descendants`` (also the finest patches under it, the detail they alone resolve).
    """

    levels: list[int] | None = None
    decision_dim: int = DECISION_DIM
    decision_heads: int = DECISION_HEADS
    decision_context: str = DECISION_CONTEXTS[0]

    def __post_init__(self) -> None:  # the model checks decision_context (config.json's own check)
        if self.levels is not None:
            object.__setattr__(self, "levels", [int(v) for v in self.levels])


@dataclass(frozen=True)
class EvaluationSettings:
    """What validation and test report besides the trained policy at the budget.

    Attributes:
        eval_budgets: further budgets the learned policy is evaluated at, each with the baselines.
        eval_baselines: rows beside the learned layout at its fraction (``oracle``: the annotations').
        calibration_images: training images that set the deployed cuts before each validation of a
            fit (0: the running average of training batches only).
    """

    eval_budgets: list[float] | None = None
    eval_baselines: list[str] | None = field(default_factory=lambda: ["uniform", "random", "entropy"])
    calibration_images: int = 512

    def __post_init__(self) -> None:
        # `null` means none, as `[]` does
        object.__setattr__(self, "eval_budgets", [float(b) for b in self.eval_budgets or []])
        object.__setattr__(self, "eval_baselines", [str(b) for b in self.eval_baselines or []])
        unknown = [b for b in self.eval_baselines if b not in EVAL_BASELINES]
        if unknown:
            raise ValueError(
                f"evaluation.eval_baselines={self.eval_baselines}: unknown {unknown}; choose from {EVAL_BASELINES}"
            )
        if not isinstance(self.calibration_images, int) or self.calibration_images < 0:
            raise ValueError(f"evaluation.calibration_images={self.calibration_images}: a count, at least 0")


@dataclass(frozen=True)
class PolicyOptions:
    """The options of the policy a run trains (``policy``) that only some policies read.

    Attributes:
        policy_checkpoint: the run a ``transferred`` policy comes from (folder, .ckpt, save_pretrained).
        transfer_finetune: PPO's epochs fine-tune a ``transferred`` policy (false: they cost nothing).
        entropy_thresholds: with ``policy: entropy``, APT's own per-level thresholds in bits, coarse
            to fine (APT lists them fine to coarse); null: cuts that meet the budget.
        apt_search: how those cuts are set: ``metric`` (the lowest task loss at the budget on the
            calibration sample) or ``quantile`` (the same share of every level split).
        sampling_seed: seed of the policy's sampling generator (its state is checkpointed).
    """

    policy_checkpoint: str | None = None
    transfer_finetune: bool = False
    entropy_thresholds: list[float] | None = None
    apt_search: str = "metric"
    sampling_seed: int = 0

    def __post_init__(self) -> None:
        if self.apt_search not in APT_SEARCHES:
            raise ValueError(f"policy_options.apt_search={self.apt_search!r}: expected one of {APT_SEARCHES}")


@dataclass(frozen=True)
class OptimSettings:
    """The optimizers of the task (dense and warm-start stages) and of the policy (PPO).

    Attributes:
        lr: learning rate of backbone, head and embeddings.
        weight_decay: AdamW weight decay (not on biases, norms, tokens and position embeddings).
        warmup_steps: linear warm-up steps of the task learning rate (then cosine to 0).
        policy_lr: learning rate of the decision module in PPO (small: λ must keep up).
        grad_clip: gradient-norm clip of the task update.
    """

    lr: float = 1e-4
    weight_decay: float = 0.05
    warmup_steps: int = 0
    policy_lr: float = 3e-4
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        check_ranges("optim", self, ("lr", "policy_lr", "grad_clip"), ("weight_decay", "warmup_steps"))


@dataclass(frozen=True)
class WarmStartSettings:
    """The warm start: the decision module imitates split labels while the backbone fine-tunes.

    Attributes:
        imitation_lr: learning rate of the decision module.
        imitation_weight: weight of the imitation BCE.
        imitation_steps: decision-module updates per batch (the extra ones re-run it alone).
        teacher_forcing: share of images laid out by the labels instead of a sample of the policy.
        finetune: fine-tune backbone, head and embeddings (the paper); false trains the decision
            module alone.
        label_target: the patch embedding the labels read: ``initial`` (a frozen copy as the warm
            start began) or ``live`` (the one being fine-tuned).
        label_source: what is imitated: ``embedding`` differences (the paper's), ``annotations``
            (the oracle's layout from the data's boxes or masks) or ``loss`` (the splits that lower the
            task loss most, read through the task's own per-image loss: no annotations needed;
            `splitlab.training.refinement_gains`), ``fidelity`` (the splits that keep the outputs
            closest to the model's own on the finest grid: the loss to its own prediction, which the
            policy can read from the image; classification and segmentation) or ``entropy`` (APT's
            pixel-entropy layout at the budget, which PPO then improves on; docs/loss_labels.md).
        loss_steps: with ``loss`` labels (and the ``loss_oracle`` row), points along each level's path
            (1: its middle; each costs about 3 forwards of the finest grid per level).
    """

    imitation_lr: float = 1e-3
    imitation_weight: float = 1.0
    imitation_steps: int = 1
    teacher_forcing: float = 0.5
    finetune: bool = True
    label_target: str = "initial"
    label_source: str = "embedding"
    loss_steps: int = 1

    def __post_init__(self) -> None:
        if self.label_target not in LABEL_TARGETS:
            raise ValueError(
                f"warm_start.label_target={self.label_target!r}: expected one of {LABEL_TARGETS}"
            )
        if self.label_source not in LABEL_SOURCES:
            raise ValueError(
                f"warm_start.label_source={self.label_source!r}: expected one of {LABEL_SOURCES}"
            )
        check_ranges("warm_start", self, ("imitation_lr",), ("imitation_weight",))
        if self.imitation_steps < 1:
            raise ValueError(f"warm_start.imitation_steps={self.imitation_steps} must be at least 1")
        if self.loss_steps < 1:
            raise ValueError(f"warm_start.loss_steps={self.loss_steps} must be at least 1")
        if not 0.0 <= self.teacher_forcing <= 1.0:
            raise ValueError(f"warm_start.teacher_forcing={self.teacher_forcing}: a share in [0, 1]")


@dataclass(frozen=True)
class ControllerSettings:
    """The fraction controller: λ per budget point, raised while the mean fraction is over budget.

    Attributes:
        lr: integral step.
        gain: proportional gain.
        damping: derivative gain.
        init: starting λ.
    """

    lr: float = 0.1
    gain: float = 0.5
    damping: float = 0.0
    init: float = 0.0

    def __post_init__(self) -> None:
        check_ranges("controller", self, (), ("lr", "gain", "damping", "init"))


GROUPS: dict[str, type] = {
    "tokenizer": TokenizerSettings,
    "evaluation": EvaluationSettings,
    "policy_options": PolicyOptions,
    "optim": OptimSettings,
    "warm_start": WarmStartSettings,
    "controller": ControllerSettings,
}

S = TypeVar("S")


def settings_of(cls: type[S], given: S | Mapping[str, Any] | None, group: str) -> S:
    """``given`` as ``cls``: the dataclass itself, a mapping of its fields (a recipe's, a checkpoint's),
    or None for the defaults; an unknown field is named with its group."""
    if isinstance(given, cls):
        return replace(given)  # runs its checks again
    if given is None:
        return cls()
    if is_dataclass(given):  # another group's dataclass: its fields, read by name
        given = asdict(given)
    if not isinstance(given, Mapping):
        raise ValueError(f"{group}: expected a mapping of {cls.__name__}'s fields, got {given!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"{group}: unknown settings {unknown}; {cls.__name__} has {sorted(known)}")
    return cls(**given)
