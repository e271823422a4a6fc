"""A task's settings, grouped as `PPOConfig` groups PPO's: what each stage and each part reads.

Each group is a dataclass with its defaults and its checks: a recipe writes a group as a mapping
(``warm_start: {label_source: annotations}``), Python passes the dataclass or the same mapping, and
LightningCLI shows every field as ``--model.init_args.<group>.<field>``. A field keeps the name the
quantity has everywhere else (``levels``, ``decision_dim`` in config.json; ``eval_budgets`` in
``splitlab curve``), so one name holds from YAML to files.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from splitlab.model.base import DEPLOYS
from splitlab.model.head_settings import head_config
from splitlab.rl import PPOConfig
from splitlab.tokenizer import (
    BASELINES,
    DECISION_CONTEXTS,
    DECISION_DIM,
    DECISION_FEATURES,
    DECISION_HEADS,
    budget_points,
)
from splitlab.tokenizer.baselines import APT_SEARCHES
from splitlab.training.settings import (
    ControllerSettings,
    OptimSettings,
    TrainingSettings,
    WarmStartSettings,
)

# the oracles (``oracle``: the annotations' cells; ``loss_oracle``: each split's worth to the task loss;
# ``fidelity_oracle``: to the model's own finest-grid output, what the fidelity labels teach): rows of
# the evaluation, never a deployed policy
ORACLES = ("oracle", "loss_oracle", "fidelity_oracle")
EVAL_BASELINES = (*BASELINES, *ORACLES)


@dataclass(frozen=True)
class TokenizerSettings:
    """The tokenizer: its levels and its decision module (config.json's names).

    Attributes:
        levels: patch sizes coarse to fine; None: up to 3 levels that divide the image.
        decision_dim: width of the decision module.
        decision_heads: heads of its cross-attention.
        decision_context: what a patch's decision reads: its ``children`` (the paper's) or its
            ``descendants`` (also the finest patches under it, the detail they alone resolve).
        decision_features: what its attention reads of each patch: the embedding through ``linear``
            maps (the paper's), or through a residual ``mlp`` first, which can tell a texture from a
            flat patch whatever its phase (`splitlab.tokenizer.SplitDecision`).
    """

    levels: list[int] | None = None
    decision_dim: int = DECISION_DIM
    decision_heads: int = DECISION_HEADS
    decision_context: str = DECISION_CONTEXTS[0]
    decision_features: str = DECISION_FEATURES[0]

    def __post_init__(self) -> None:  # the model checks the choices (config.json's own check)
        if self.levels is not None:
            object.__setattr__(self, "levels", [int(v) for v in self.levels])


@dataclass(frozen=True)
class EvaluationSettings:
    """What validation and test report besides the trained policy at the budget.

    Attributes:
        eval_budgets: further budgets the learned policy is evaluated at, each with the baselines.
        eval_baselines: rows beside the learned layout at its fraction: baselines, and the oracles
            (``oracle``: the annotations'; ``loss_oracle``, ``fidelity_oracle``: about 5 forwards of
            the finest grid per image each).
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


GROUPS: dict[str, type] = {
    "tokenizer": TokenizerSettings,
    "evaluation": EvaluationSettings,
    "policy_options": PolicyOptions,
    "optim": OptimSettings,
    "warm_start": WarmStartSettings,
    "controller": ControllerSettings,
}


def model_config(hparams: Mapping[str, Any], head: Any) -> dict[str, Any]:
    """The `SplitModel` config (config.json's flat names) of a task's settings: the backbone and
    tokenizer, the budget range as its points, the deployed policy, and the head's settings ``head``
    (the model class's head dataclass, `splitlab.model.head_settings`)."""
    kwargs = copy.deepcopy(dict(hparams["backbone_kwargs"] or {}))
    tokenizer: TokenizerSettings = hparams["tokenizer"]
    budget, budget_range = float(hparams["budget"]), hparams["budget_range"]
    config = {
        "backbone": hparams["backbone"],
        "pretrained": hparams["pretrained"],
        # timm's local weights and PackedViT's backend: config.json keeps them apart from timm's sizes
        **{key: kwargs.pop(key) for key in ("checkpoint_path", "attn_backend") if key in kwargs},
        "backbone_kwargs": kwargs,
        **asdict(tokenizer),
        "budget": budget,
        "budget_points": budget_points(budget_range) if budget_range is not None else [budget],
        "max_fraction": hparams["max_fraction"],
        "policy": DEPLOYS.get(hparams["policy"], hparams["policy"]),  # a transferred policy is learned
        "head": head_config(head),
    }
    return config


def training_settings(hparams: Mapping[str, Any]) -> TrainingSettings:
    """What the training object reads (`splitlab.training.SplitTraining`) of a task's settings."""
    options: PolicyOptions = hparams["policy_options"]
    ppo: PPOConfig = hparams["ppo"]
    return TrainingSettings(
        hparams["policy"],
        hparams["optim"],
        hparams["warm_start"],
        ppo,
        hparams["controller"],
        int(options.sampling_seed),
        bool(options.transfer_finetune),
    )
