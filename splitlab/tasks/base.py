"""`SplitTask`: the LightningModule every task builds on (stages, optimizers, evaluation, summary)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from lightning import LightningModule
from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.backbone import PackedViT
from splitlab.lightning_private import attached_trainer
from splitlab.metrics import PolicyStats
from splitlab.model import SplitModel, model_settings
from splitlab.model.base import TRAINED_POLICIES as POLICIES
from splitlab.rl import BudgetSampler, FractionController, PPOConfig
from splitlab.tasks.evaluation import PolicyEvaluation, slot
from splitlab.tasks.state import TaskState
from splitlab.tasks.training import LABEL_TARGETS, Stage, StageTraining
from splitlab.tokenizer import BASELINES, LabelEmbedding, Levels, SplitTokenizer, TokenLayout


class SplitTask(StageTraining, PolicyEvaluation, TaskState, LightningModule):
    """A SPLIT model for one task: tokenizer + `PackedViT` + task head, trained in stages.

    Stages (entered through `set_stage`, which `splitlab.callbacks.SplitSchedule` calls; the
    schedule also tells the task its epoch counts through `plan_stages`):

    - ``dense``: the backbone and head train on the uniform finest grid (pretraining a backbone
      that has no pretrained weights, e.g. in CI).
    - ``warm_start``: the decision module imitates embedding-difference labels (BCE) while the
      backbone and head fine-tune on mixed-resolution layouts sampled from that policy (or stay as
      they are: ``warm_start_finetune``).
    - ``ppo``: backbone, head and embeddings are frozen; the decision module alone learns from
      reward = -per-sample task loss - λ·token fraction, λ held by a `FractionController`.

    The deployable parts (backbone, tokenizer, head, names, preprocessing) are one `SplitModel`,
    ``self.model`` (``model_class`` of the task: its head); the task adds what only training needs.
    Subclasses supply the model class, the per-sample loss and the metrics; the stage logic lives
    here once. The task imports no callback: the schedule, pictures and layout
    writer come from the recipe or the CLI's defaults (`splitlab.cli`). Optimisation is manual (two optimizers: task and policy), as
    PPO needs several updates per batch.

    Args:
        backbone: timm model name (a ViT or an EVA-02).
        pretrained: load timm's pretrained weights (needs the hub or its cache).
        checkpoint_path: local backbone weights for offline machines.
        backbone_kwargs: extra ``timm.create_model`` arguments (``img_size``, ``depth``, ...).
        levels: patch sizes coarse to fine; default: up to 3 levels that divide the image.
        target_fraction: the token budget: target mean token fraction of training (unconditioned
            policy) and the budget evaluation, test and predict deploy.
        budgets: ``[lowest, highest]``: train one budget-conditioned policy for every budget in
            this range (points ``budget_step`` apart, one drawn per batch); None trains for
            ``target_fraction`` alone.
        budget_step: spacing of the training budget points.
        max_fraction: hard cap on any image's token fraction at inference (None: no cap).
        eval_budgets: further budgets the learned policy is evaluated at (budget-conditioned
            policies), each with the baselines at its realised fraction (``learned@0.3``, ...).
        calibration_images: training images that set the deployed cut of every budget before each
            validation of a fit (`recalibrate`; 0: the running average of training batches only).
        decision_dim: width of the decision module.
        decision_heads: heads of its cross-attention.
        attn_backend: packed-attention backend (``auto`` picks the fastest available).
        lr: learning rate of backbone, head and embeddings (dense and warm-start stages).
        weight_decay: AdamW weight decay (not on biases, norms, tokens and position embeddings).
        warmup_steps: linear warm-up steps of the task learning rate (then cosine to 0).
        policy_lr: learning rate of the decision module in PPO.
        imitation_lr: learning rate of the decision module in the warm start (imitation is an
            easy supervised problem; PPO needs small steps so λ can keep up with the policy).
        imitation_weight: weight of the warm-start BCE.
        teacher_forcing: share of warm-start images whose layout is the imitation labels instead of
            a sample of the policy (`warm_start_layout`).
        warm_start_finetune: fine-tune backbone, head and embeddings on the warm start's layouts
            (the paper); false trains the decision module alone, e.g. a backbone that already reads
            mixed layouts well (docs/detection.md measures both).
        label_target: the patch embedding the imitation labels read: ``initial`` (a frozen copy as
            the warm start began, a fixed target) or ``live`` (the one being fine-tuned; labels
            follow it). Measured in docs/budgets.md.
        grad_clip: gradient-norm clip of the task update.
        ppo: PPO settings.
        lambda_lr: integral step of the fraction controller.
        lambda_gain: proportional gain of the fraction controller.
        lambda_damping: derivative gain of the fraction controller.
        lambda_init: starting λ.
        policy: the layout policy this run trains and deploys: ``learned`` (SPLIT), or ``entropy``
            (APT: the warm start fine-tunes backbone and head on entropy layouts at the target
            fraction and PPO is skipped) or ``random``, trained in the same pipeline with the same
            epochs, for a comparison between equally fine-tuned models.
        entropy_thresholds: APT's per-level entropy thresholds in bits, as APT configures them
            (``thresholds``), one per level coarser than the finest, coarse to fine: with ``policy:
            entropy`` a patch splits where its entropy reaches its level's threshold, and the
            fraction is whatever they give (null: cuts set from the calibration sample to meet
            ``target_fraction``). APT's own list runs from its 2x-base patches upwards (fine to
            coarse): reverse it for three or more scales.
        apt_search: how ``policy: entropy`` sets its cuts without ``entropy_thresholds``: ``metric``
            (the per-level cuts whose layouts give the lowest task loss at the budget on the
            calibration sample, with the backbone entering the warm start) or ``quantile`` (the
            same share of every level's patches split).
        eval_baselines: baselines evaluated beside the learned layout in validation at the end of
            fit, in ``validate`` and in ``test`` (at the learned layout's realised fraction).
        init_checkpoint: weights to start from (a splitlab checkpoint, e.g. a ``dense`` run).
        sampling_seed: seed of the policy's sampling generator (its state is checkpointed).
    """

    task_name = "task"
    metric_name = "metric"
    model_class: ClassVar[type[SplitModel]] = SplitModel

    def __init__(
        self,
        backbone: str = "vit_tiny_patch16_224",
        pretrained: bool = False,
        checkpoint_path: str = "",
        backbone_kwargs: dict[str, Any] | None = None,
        levels: Sequence[int] | None = None,
        target_fraction: float = 0.7,
        budgets: Sequence[float] | None = None,
        budget_step: float = 0.1,
        max_fraction: float | None = None,
        eval_budgets: Sequence[float] | None = (),
        calibration_images: int = 512,
        decision_dim: int = 128,
        decision_heads: int = 4,
        attn_backend: str = "auto",
        lr: float = 1e-4,
        weight_decay: float = 0.05,
        warmup_steps: int = 0,
        policy_lr: float = 3e-4,
        imitation_lr: float = 1e-3,
        imitation_weight: float = 1.0,
        teacher_forcing: float = 0.5,
        warm_start_finetune: bool = True,
        label_target: str = "initial",
        grad_clip: float = 1.0,
        ppo: PPOConfig | None = None,
        lambda_lr: float = 0.1,
        lambda_gain: float = 0.5,
        lambda_damping: float = 0.0,
        lambda_init: float = 0.0,
        policy: str = "learned",
        entropy_thresholds: Sequence[float] | None = None,
        apt_search: str = "metric",
        eval_baselines: Sequence[str] | None = ("uniform", "random", "entropy"),
        init_checkpoint: str | None = None,
        sampling_seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.hparams.eval_budgets = list(eval_budgets or [])  # `null` means none, as `[]` does
        self.hparams.eval_baselines = eval_baselines = list(eval_baselines or [])
        self.automatic_optimization = False
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r}: expected one of {POLICIES}")
        if label_target not in LABEL_TARGETS:
            raise ValueError(f"label_target={label_target!r}: expected one of {LABEL_TARGETS}")
        if policy != "learned" and budgets is not None:
            raise ValueError(
                f"budgets={list(budgets)} needs policy='learned' (a {policy} layout reads no budget)"
            )
        unknown = [b for b in eval_baselines if b not in BASELINES]
        if unknown:
            raise ValueError(
                f"eval_baselines={list(eval_baselines)}: unknown {unknown}; choose from {BASELINES}"
            )
        self.ppo = ppo or PPOConfig()
        self.stage: Stage = "warm_start"
        self.stage_plan: dict[str, int] | None = None
        self.configure_models()
        self.check_apt()
        self.sync_deployed()
        self.configure_metrics()
        self._generator: torch.Generator | None = None
        self._pending_generator_state: Tensor | None = None
        self._rebuilt_weights_loaded = False  # see TaskState.saved_as_rebuilt
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)

    # ----------------------------------------------------------------------------- building
    def configure_models(self) -> None:
        """The deployable model (`SplitModel`: backbone, tokenizer, head) and the fraction controller."""
        hp = self.hparams
        self.model = self.model_class(model_settings(hp, self.model_class.head_keys))
        self.target_fraction = self.model.budget
        self.label_embedding = LabelEmbedding(
            self.backbone.model.patch_embed
        )  # the warm start's fixed target
        points = self.model.tokenizer.operating_points.budgets.tolist()
        self.check_budgets()
        self.budget_sampler = BudgetSampler(len(points))
        self.controller = FractionController(
            points,
            lr=hp.lambda_lr,
            gain=hp.lambda_gain,
            damping=hp.lambda_damping,
            lambda_init=hp.lambda_init,
            reduce=self._mean_over_ranks,
        )

    # the deployed parts, as the model holds them
    @property
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
    def max_tokens(self) -> int | None:
        return self.model.max_tokens

    def configure_metrics(self) -> None:
        """Per-policy metric collections for validation and test (one per policy and evaluation budget)."""
        for split in ("val", "test"):
            stats = nn.ModuleDict(
                {slot(name): PolicyStats(self.build_metrics()) for name in self.policy_names()}
            )
            setattr(self, f"{split}_stats", stats)

    def build_metrics(self) -> MetricCollection:
        """A fresh metric collection of the task (keys are metric names, one is `metric_name`)."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------- task API
    def split_batch(self, batch: Any) -> tuple[Tensor, Any]:
        """``(images, targets)`` of a batch."""
        return batch[0], batch[1]

    def repeat_targets(self, targets: Any, times: int) -> Any:
        """Targets for ``times`` rollouts of the batch, rollout after rollout."""
        return targets.repeat(times, *([1] * (targets.dim() - 1)))

    def per_sample_loss(self, outputs: Any, targets: Any) -> Tensor:
        """The task loss of each image, shape ``(B,)``: its mean trains the task, its values are PPO rewards."""
        raise NotImplementedError

    def update_metrics(
        self, metrics: MetricCollection, outputs: Any, targets: Any, layout: TokenLayout
    ) -> None:
        """Feed one batch (and the layout it was computed on) to a metric collection."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------- forward
    def forward_layout(self, layout: TokenLayout) -> Any:
        """Task outputs of a layout (the model's packed backbone and head)."""
        return self.model.forward_layout(layout)

    def forward(
        self,
        images: Tensor,
        budget: float | None = None,
        max_fraction: float | None = None,
        policy: str | None = None,
        seed: int = 0,
    ) -> tuple[Any, TokenLayout]:
        """Task outputs and the layout used: the deployed path, `SplitModel.forward` (``policy``
        defaults to the deployed one; ``seed`` drives the random policy)."""
        policy = self.deployed_policy if policy is None else policy
        return self.model(images, budget=budget, max_fraction=max_fraction, policy=policy, seed=seed)

    # ----------------------------------------------------------------------------- stages
    @property
    def deployed_policy(self) -> str:
        """What inference uses: the trained policy (``policy``), or the uniform grid while only dense
        training has run."""
        return "uniform" if self.stage == "dense" else self.hparams.policy

    def sync_deployed(self) -> None:
        """Tell the model which policy it deploys (and so which one its hard cap binds)."""
        self.model.policy = self.deployed_policy

    def _mean_over_ranks(self, value: Tensor) -> Tensor:
        if attached_trainer(self) is None or self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(value, reduce_op="mean")
