"""`SplitTask`: the LightningModule every task builds on (stages, optimizers, evaluation, summary)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning import LightningModule
from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.backbone import PackedFeatures, PackedViT
from splitlab.metrics import PolicyStats
from splitlab.rl import BudgetSampler, FractionController, PPOConfig
from splitlab.tasks.evaluation import PolicyEvaluation, slot
from splitlab.tasks.state import TaskState
from splitlab.tasks.training import Stage, StageTraining
from splitlab.tokenizer import BASELINES, Levels, SplitTokenizer, TokenLayout, budget_points

POLICIES = ("learned", "entropy", "random")


class SplitTask(StageTraining, PolicyEvaluation, TaskState, LightningModule):
    """A SPLIT model for one task: tokenizer + `PackedViT` + task head, trained in stages.

    Stages (entered through `set_stage`, which `splitlab.callbacks.SplitSchedule` calls; the
    schedule also tells the task its epoch counts through `plan_stages`):

    - ``dense``: the backbone and head train on the uniform finest grid (pretraining a backbone
      that has no pretrained weights, e.g. in CI).
    - ``warm_start``: the decision module imitates embedding-difference labels (BCE) while the
      backbone and head fine-tune on mixed-resolution layouts sampled from that policy.
    - ``ppo``: backbone, head and embeddings are frozen; the decision module alone learns from
      reward = -per-sample task loss - λ·token fraction, λ held by a `FractionController`.

    Subclasses supply the head (`configure_head`), the per-sample loss and the metrics; the
    stage logic lives here once. The task imports no callback: the schedule, pictures and layout
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
        eval_baselines: baselines evaluated beside the learned layout in validation at the end of
            fit, in ``validate`` and in ``test`` (at the learned layout's realised fraction).
        init_checkpoint: weights to start from (a splitlab checkpoint, e.g. a ``dense`` run).
        sampling_seed: seed of the policy's sampling generator (its state is checkpointed).
    """

    task_name = "task"
    metric_name = "metric"

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
        grad_clip: float = 1.0,
        ppo: PPOConfig | None = None,
        lambda_lr: float = 0.1,
        lambda_gain: float = 0.5,
        lambda_damping: float = 0.0,
        lambda_init: float = 0.0,
        policy: str = "learned",
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
        self.configure_metrics()
        self._generator: torch.Generator | None = None
        self._pending_generator_state: Tensor | None = None
        self._rebuilt_weights_loaded = False  # see TaskState.saved_as_rebuilt
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)

    # ----------------------------------------------------------------------------- building
    def configure_models(self) -> None:
        """Backbone, tokenizer, head and the fraction controller."""
        hp = self.hparams
        self.backbone = PackedViT(
            hp.backbone,
            pretrained=hp.pretrained,
            checkpoint_path=hp.checkpoint_path,
            attn_backend=hp.attn_backend,
            **(hp.backbone_kwargs or {}),
        )
        if hp.levels is None:
            self.levels = Levels.default(self.backbone.patch_size, self.backbone.img_size)
        else:
            self.levels = Levels.build(hp.levels, patch_size=self.backbone.patch_size)
        self.levels.check_image(self.backbone.img_size)
        self.target_fraction = self.levels.check_fraction(hp.target_fraction)
        points = (
            budget_points(hp.budgets, hp.budget_step) if hp.budgets is not None else [self.target_fraction]
        )
        self.tokenizer = SplitTokenizer(
            self.backbone.embed_dim, self.levels, hp.decision_dim, hp.decision_heads, budgets=points
        )
        self.check_budgets()
        # APT's per-level entropy cuts when it is the trained policy, and the budget they meet (-1:
        # not set yet; `recalibrate` sets them from the calibration sample)
        self.register_buffer("apt_cuts", torch.zeros(self.levels.num - 1))
        self.register_buffer("apt_fraction", torch.tensor(-1.0))
        self.head = self.configure_head()
        self.budget_sampler = BudgetSampler(len(points))
        self.controller = FractionController(
            points,
            lr=hp.lambda_lr,
            gain=hp.lambda_gain,
            damping=hp.lambda_damping,
            lambda_init=hp.lambda_init,
            reduce=self._mean_over_ranks,
        )

    def configure_head(self) -> nn.Module | None:
        """The task head on top of `PackedFeatures` (None when the timm model's own head is used)."""
        return None

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

    def forward_task(self, features: PackedFeatures) -> Any:
        """Task outputs from backbone features: the head's (subclasses without a head override this)."""
        if self.head is None:
            raise NotImplementedError(f"{type(self).__name__} has no head: override forward_task")
        return self.head(features)

    def per_sample_loss(self, outputs: Any, targets: Any) -> Tensor:
        """The task loss of each image, shape ``(B,)``: its mean trains the task, its values are PPO rewards."""
        raise NotImplementedError

    def update_metrics(
        self, metrics: MetricCollection, outputs: Any, targets: Any, layout: TokenLayout
    ) -> None:
        """Feed one batch (and the layout it was computed on) to a metric collection."""
        raise NotImplementedError

    def backbone_indices(self) -> int | Sequence[int] | None:
        """Blocks whose outputs the head needs (dense heads); None for the final features only."""
        return None

    # ----------------------------------------------------------------------------- forward
    def layout(
        self,
        images: Tensor,
        policy: str = "learned",
        fraction: float | None = None,
        seed: int = 0,
        budget: float | None = None,
    ) -> TokenLayout:
        """A layout for ``images``: the learned policy at ``budget`` (default ``target_fraction``) or a
        baseline at ``fraction`` (default: the budget). The hard cap binds the learned policy and
        whichever policy the run deploys (APT or random trained in the pipeline); a baseline row of
        the comparison stays uncapped, so that it is compared at the matched mean fraction."""
        budget = self.target_fraction if budget is None else budget
        if policy == "learned":
            return self.tokenizer(
                images, self.backbone, mode="threshold", budget=budget, max_tokens=self.max_tokens
            )
        fraction = budget if fraction is None else fraction
        generator = torch.Generator(images.device).manual_seed(seed)
        scores, threshold = self.baseline_scores(policy, images, fraction, generator)
        cap = self.max_tokens if policy == self.deployed_policy else None
        return self.tokenizer(
            images, self.backbone, mode="scores", scores=scores, threshold=threshold, max_tokens=cap
        )

    def forward_layout(self, layout: TokenLayout) -> Any:
        """Task outputs of a layout: the packed backbone (with the blocks the head needs), then the head."""
        return self.forward_task(self.backbone(layout, indices=self.backbone_indices()))

    def forward(
        self,
        images: Tensor,
        policy: str = "learned",
        fraction: float | None = None,
        seed: int = 0,
        budget: float | None = None,
    ) -> tuple[Any, TokenLayout]:
        """Task outputs and the layout used, for inference (``seed`` drives the random baseline)."""
        layout = self.layout(images, policy, fraction, seed, budget)
        return self.forward_layout(layout), layout

    # ----------------------------------------------------------------------------- stages
    @property
    def deployed_policy(self) -> str:
        """What inference uses: the trained policy (``policy``), or the uniform grid while only dense
        training has run."""
        return "uniform" if self.stage == "dense" else self.hparams.policy

    def _mean_over_ranks(self, value: Tensor) -> Tensor:
        if self._trainer is None or self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(value, reduce_op="mean")
