"""The training object's own settings (`SplitTraining`): its optimizers, the warm start, the λ
controller. Dataclasses with their defaults and checks, as the task's other groups are
(`splitlab.tasks.settings`, which gathers them all): a recipe writes each as a mapping, and an error
names the field as the command line takes it (``model.init_args.<group>.<field>``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from splitlab.rl import PPOConfig

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


@dataclass(frozen=True)
class TrainingSettings:
    """All that `splitlab.training.SplitTraining` reads: a task's groups of the same names.

    Attributes:
        policy: the policy trained: ``learned`` (SPLIT), ``entropy`` (APT), ``random``, ``transferred``.
        optim: the optimizers (`OptimSettings`).
        warm_start: the warm start (`WarmStartSettings`).
        ppo: PPO (`splitlab.rl.PPOConfig`).
        controller: the λ controller (`ControllerSettings`).
        sampling_seed: seed of the budget draws (and of the policy's generator where none is given).
        transfer_finetune: PPO fine-tunes a ``transferred`` policy.
    """

    policy: str = "learned"
    optim: OptimSettings = field(default_factory=OptimSettings)
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    sampling_seed: int = 0
    transfer_finetune: bool = False
