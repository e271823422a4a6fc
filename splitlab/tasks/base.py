"""`SplitTask`: the template every task builds on: what a task overrides, and what runs when."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.backbone import PackedViT
from splitlab.lightning_private import attached_trainer
from splitlab.model import SplitModel
from splitlab.model.base import COMMON
from splitlab.model.head_settings import picked, settings_of
from splitlab.rl import PPOConfig
from splitlab.tasks.calibration import check_apt, check_budgets
from splitlab.tasks.evaluation import PolicyComparison
from splitlab.tasks.hooks import TaskHooks
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.settings import (
    GROUPS,
    ControllerSettings,
    EvaluationSettings,
    OptimSettings,
    PolicyOptions,
    TokenizerSettings,
    WarmStartSettings,
    model_config,
    training_settings,
)
from splitlab.tasks.state import (
    RebuiltWeights,
    SamplingStream,
    adopt_data,
    check_task_data,
    load_init_weights,
    run_facts,
)
from splitlab.tasks.training import check_label_source
from splitlab.tasks.transfer import check_policy, transferred_decision
from splitlab.tokenizer import Levels, SplitTokenizer, TokenLayout
from splitlab.training import SplitTraining
from splitlab.training.algorithm import trained_parts
from splitlab.training.progress import Stage


class SplitTask(TaskHooks):
    """A SPLIT model for one task (`SplitModel`: tokenizer + `PackedViT` + head, ``self.model``) and
    what only training needs, trained in stages: ``dense`` (uniform grid, a backbone without
    pretrained weights), ``warm_start`` (the decision module imitates embedding-difference labels
    while the backbone fine-tunes on its layouts), ``ppo`` (backbone frozen, the policy learns from
    reward = -task loss - λ·token fraction). `splitlab.callbacks.SplitSchedule` enters the stages.

    A task names ``model_class`` (its head) and ``logic_class``, its own code (`TaskLogic`: a plain
    object on the model and the task's own settings, ``logic``): `build_metrics`, `per_image_loss`,
    `update_metrics`, `unpack_batch`, `describe_prediction` and the rest of the task API hand it the
    run's facts it reads. The task class keeps what is Lightning's (`rebuilt_keys`, hooks).

    The work is done by plain objects the task holds: ``algorithm`` (`splitlab.training.SplitTraining`:
    the stages, warm start, PPO, λ, budgets, the cuts' calibration, which a plain loop drives too),
    ``comparison`` (`PolicyComparison`: the learned layout against the baselines), ``sampling`` (the
    policy's generator) and ``rebuilt`` (the weights checkpoints leave out). Lightning's part, every
    hook, is its one base, `TaskHooks` (tasks/hooks.py), which reads of the task only what this class
    defines (tests/tasks/test_task_parts.py).
    """

    task_name = "task"
    metric_name = "metric"
    learned_name = "learned"  # the summary's name of a policy PPO trained (a multi-task run's: multitask)
    model_class: ClassVar[type[SplitModel]] = SplitModel
    logic_class: ClassVar[type[TaskLogic]] = TaskLogic
    task_groups: ClassVar[dict[str, type]] = {}  # a task's own settings groups (detection's ``detector``)

    def __init__(
        self,
        backbone: str = COMMON["backbone"],
        pretrained: bool = COMMON["pretrained"],
        backbone_kwargs: dict[str, Any] | None = None,
        tokenizer: TokenizerSettings = TokenizerSettings(),
        budget: float = COMMON["budget"],
        budget_range: Sequence[float] | None = None,
        max_fraction: float | None = None,
        policy: str = COMMON["policy"],
        policy_options: PolicyOptions = PolicyOptions(),
        evaluation: EvaluationSettings = EvaluationSettings(),
        optim: OptimSettings = OptimSettings(),
        warm_start: WarmStartSettings = WarmStartSettings(),
        ppo: PPOConfig = PPOConfig(),
        controller: ControllerSettings = ControllerSettings(),
        init_checkpoint: str | None = None,
    ) -> None:
        """Settings (docs/budgets.md, comparison.md and detection.md measure them); each group's
        fields are documented on its dataclass (`splitlab.tasks.settings`, `splitlab.rl.PPOConfig`).

        Args:
            backbone: timm model name (a ViT or an EVA-02).
            pretrained: load timm's pretrained weights (needs the hub or its cache).
            backbone_kwargs: extra ``timm.create_model`` arguments (``img_size``, ``depth``, a local
                ``checkpoint_path`` for offline machines) and `PackedViT`'s ``attn_backend``.
            tokenizer: levels and decision module (`TokenizerSettings`).
            budget: the mean token fraction training aims at and evaluation, test and predict deploy.
            budget_range: ``[lowest, highest]`` (or ``[lowest, highest, step]``, step 0.1 by default):
                one budget-conditioned policy for every budget in this range (one point drawn per
                batch); None: ``budget`` only.
            max_fraction: hard cap on any image's token fraction at inference (None: no cap).
            policy: the layout policy this run trains and deploys: ``learned`` (SPLIT), ``entropy``
                (APT, fine-tuned on its layouts in the warm start, no PPO), ``random``, or
                ``transferred`` (another run's decision module, frozen; docs/reuse.md).
            policy_options: what only some policies read (`PolicyOptions`: the transferred policy's
                run, APT's thresholds and search, the sampling seed).
            evaluation: further budgets and baseline rows, calibration sample (`EvaluationSettings`).
            optim: learning rates, weight decay, warm-up, clipping (`OptimSettings`).
            warm_start: imitation labels and their weight, teacher forcing (`WarmStartSettings`).
            ppo: PPO settings (`PPOConfig`).
            controller: the fraction controller's gains (`ControllerSettings`).
            init_checkpoint: weights to start from (a splitlab checkpoint, e.g. a ``dense`` run).
        """
        super().__init__()
        self.save_hyperparameters()
        hp = self.hparams
        for group, cls in (*GROUPS.items(), ("ppo", PPOConfig), *self.task_groups.items()):
            hp[group] = settings_of(cls, hp[group], group)  # a recipe's mapping, as its dataclass
        hp.budget_range = list(budget_range) if budget_range is not None else None
        options = hp.policy_options
        check_policy(policy, budget_range, options.policy_checkpoint, options.transfer_finetune)
        self.sampling = SamplingStream(options.sampling_seed)
        self.configure_models()
        if policy == "transferred":  # another run's decision module, deployed frozen
            weights = transferred_decision(options.policy_checkpoint, self.model)
            self.model.tokenizer.decision.load_state_dict(weights)
        check_apt(policy, options, self.levels)
        check_label_source(
            hp.warm_start.label_source, self.logic, type(self).__name__, tuple(hp.evaluation.eval_baselines)
        )
        self.sync_deployed()
        self.configure_metrics()
        self.rebuilt = RebuiltWeights(self.rebuilt_keys(), self.model)
        if init_checkpoint:
            load_init_weights(self, self.model, self.rebuilt, init_checkpoint)

    # ----------------------------------------------------------------------------- building
    def configure_models(self) -> None:
        """The deployable model (`SplitModel`: backbone, tokenizer, head), the task's own code
        (``logic``) and the training object (``algorithm``), whose state the task registers."""
        hp = self.hparams
        self.model = self.model_class(model_config(hp, picked(self.model_class.head_settings_class, hp)))
        self.logic = self.build_logic()
        check_budgets(self.model, hp.evaluation, hp.budget_range, hp.max_fraction)
        self.algorithm = SplitTraining(
            self.model,
            self.logic,
            training_settings(hp),
            self.mean_over_ranks,
            lambda: self.generator,
            self.task_modules(),
        )
        # the algorithm's state, under the names checkpoints keep it by
        self.controller = self.algorithm.controller  # λ per budget point
        self.budget_sampler = self.algorithm.budget_sampler
        self.label_embedding = self.algorithm.label_embedding  # the warm start's label target

    def configure_metrics(self) -> None:
        """The comparison of the learned layout with the baselines (`PolicyComparison`; its metric
        stores are registered here, so they move with the model)."""
        self.comparison = PolicyComparison(self.model, self.logic, self.algorithm, self.hparams.evaluation)
        self.policy_stats = self.comparison.stores

    def build_logic(self) -> TaskLogic:
        """The task's own code: ``logic_class`` on the model, with the task's own settings."""
        return self.logic_class(self.model, picked(self.logic_class.settings_class, self.hparams))

    def task_modules(self) -> list[nn.Module]:
        """What the task optimizer trains and frozen stages freeze: backbone, embeddings, head."""
        return trained_parts(self.model)

    @property
    def stage(self) -> Stage:
        """The stage training is in (`Progress`, its one writer, also counts the PPO updates run)."""
        return self.algorithm.stage

    @property  # the deployed parts, as the model holds them
    def backbone(self) -> PackedViT:
        return self.model.backbone

    @property
    def tokenizer(self) -> SplitTokenizer:
        return self.model.tokenizer

    @property
    def head(self) -> nn.Module | None:
        return self.model.head

    @property
    def levels(self) -> Levels:
        return self.model.levels

    @property
    def budget(self) -> float:
        """The budget training aims at and inference deploys: the model's (one copy, kept there)."""
        return self.model.budget

    def build_metrics(self) -> MetricCollection:
        """A fresh metric collection of the task (keys are metric names, one is `metric_name`)."""
        return self.logic.build_metrics()

    # ----------------------------------------------------------------------------- task API
    def unpack_batch(self, batch: Any) -> tuple[Tensor, Any]:
        """``(images, targets)`` of a batch."""
        return self.logic.unpack_batch(batch)

    def repeat_targets(self, targets: Any, times: int) -> Any:
        """Targets for ``times`` rollouts of the batch, rollout after rollout."""
        return self.logic.repeat_targets(targets, times)

    def per_image_loss(self, outputs: Any, targets: Any, generator: torch.Generator | None = None) -> Tensor:
        """The task loss of each image, ``(B,)``: its mean trains the task, its values are PPO rewards
        (``generator``: the random source of a loss that samples, default the run's)."""
        return self.algorithm.per_image_loss(outputs, targets, generator)

    def loss_gains(
        self, images: Tensor, targets: Any, generator: Any = None, tokens: Any = None, own: bool = False
    ) -> list[Tensor]:
        """How much each split lowers this batch's task loss (`refinement_gains`): ``loss`` labels, ``loss_oracle``;
        with ``own``, the loss to the model's own prediction on the finest grid (``fidelity`` labels)."""
        return self.algorithm.loss_gains(images, targets, generator, tokens, own)

    def update_metrics(
        self, metrics: MetricCollection, outputs: Any, targets: Any, layout: TokenLayout
    ) -> None:
        """Feed one batch (and the layout it was computed on) to a metric collection."""
        self.logic.update_metrics(metrics, outputs, targets, layout)

    def describe_prediction(self, outputs: Any, index: int, target: Any = None) -> Any:
        """A JSON-friendly summary of one image's prediction (``target``: its batch entry, if any)."""
        return self.logic.describe_prediction(outputs, index, target)

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor | None:
        """``(B, rows, cols)`` bool: the finest cells a batch's annotations (boxes, masks) say need finest
        tokens, or None (the default); the ``oracle`` row and ``label_source: annotations`` read it."""
        return self.logic.annotated_cells(batch, grid)

    # ----------------------------------------------------------------------------- forward
    def forward_layout(self, layout: TokenLayout) -> Any:
        """Task outputs of a layout (the model's packed backbone and head, as the task's logic runs them)."""
        return self.logic.forward_layout(layout)

    def forward(
        self,
        images: Tensor,
        budget: float | None = None,
        max_fraction: float | None = None,
        policy: str | None = None,
        seed: int = 0,
    ) -> tuple[Any, TokenLayout]:
        """Task outputs and the layout used: ``policy``'s layout (default: deployed), `forward_layout`."""
        policy = self.deployed_policy if policy is None else policy
        layout = self.model.layout(images, budget, max_fraction, policy, seed)
        return self.forward_layout(layout), layout

    # ----------------------------------------------------------------------------- stages
    @property
    def deployed_policy(self) -> str:
        """What inference uses: the trained policy (``policy``), or the uniform grid while only dense
        training has run."""
        return self.algorithm.deployed_policy

    def sync_deployed(self) -> None:
        """Tell the model which policy it deploys (and so which one its hard cap binds)."""
        self.algorithm.sync_deployed()

    # ----------------------------------------------------------------------------- ranks
    @property
    def rank(self) -> int:
        return self.trainer.global_rank if attached_trainer(self) is not None else 0

    def mean_over_ranks(self, value: Tensor) -> Tensor:
        """``value`` averaged over DDP ranks (itself on one process): what every rank must agree on."""
        if attached_trainer(self) is None or self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(value, reduce_op="mean")

    @property
    def generator(self) -> torch.Generator:
        """The policy's sampling generator: this rank's `SamplingStream`, on the model's device."""
        return self.sampling.on(self.device, self.rank)

    # ----------------------------------------------------------------------------- data and weights
    @property
    def num_classes(self) -> int | None:
        """Classes of the task's head (None where the task has no class count)."""
        return self.logic.num_classes

    def check_data(self, datamodule: Any) -> None:
        """Refuse data that does not fit the model, before any work (Lightning sets the data up first)."""
        facts = run_facts(attached_trainer(self))
        check_task_data(type(self).__name__, self.model, self.hparams, self.logic, datamodule, facts)

    def adopt_data(self, datamodule: Any) -> None:
        """Give the model what the data says about its inputs (preprocessing, names: `adopt_data`)."""
        adopt_data(self.model, datamodule)

    def rebuilt_keys(self) -> set[str]:
        """State-dict keys the task rebuilds identically whenever it is built (e.g. a frozen language
        model loaded by name): checkpoints leave them out (`RebuiltWeights`). None by default."""
        return set()
