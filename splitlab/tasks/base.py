"""`SplitTask`: the template every task builds on: what a task overrides, and what runs when."""

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
from splitlab.model.base import DEPLOYS
from splitlab.rl import BudgetSampler, FractionController, PPOConfig
from splitlab.tasks.calibration import Calibration
from splitlab.tasks.evaluation import PolicyEvaluation, check_baselines, slot
from splitlab.tasks.state import SamplingStream, TaskState
from splitlab.tasks.training import Stage, StageTraining, check_warm_start
from splitlab.tasks.transfer import check_policy, transferred_decision
from splitlab.tokenizer import LabelEmbedding, Levels, SplitTokenizer, TokenLayout


class SplitTask(StageTraining, Calibration, PolicyEvaluation, TaskState, LightningModule):
    """A SPLIT model for one task (`SplitModel`: tokenizer + `PackedViT` + head, ``self.model``) and
    what only training needs, trained in stages: ``dense`` (uniform grid, a backbone without
    pretrained weights), ``warm_start`` (the decision module imitates embedding-difference labels
    while the backbone fine-tunes on its layouts), ``ppo`` (backbone frozen, the policy learns from
    reward = -task loss - λ·token fraction). `splitlab.callbacks.SplitSchedule` enters the stages.

    A task overrides ``model_class`` (its head), `build_metrics`, `per_image_loss` and
    `update_metrics`; where its batches or outputs differ, `unpack_batch`, `repeat_targets`,
    `annotated_cells`, `finish_outputs`, `finish_results`, `describe_prediction` and `rebuilt_keys`.

    The parts, each in its own file, use only what this class defines and Lightning's API, never
    each other (tests/tasks/test_task_parts.py): `StageTraining` (the training step of each stage,
    on `Optimization`'s two optimizers), `Calibration` (the deployed cuts), `PolicyEvaluation`
    (learned against baselines, the summary, predictions) and `TaskState` (checkpoints, data checks).
    The hooks at the end of this class say when each runs.
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
        decision_context: str = "children",
        attn_backend: str = "auto",
        lr: float = 1e-4,
        weight_decay: float = 0.05,
        warmup_steps: int = 0,
        policy_lr: float = 3e-4,
        imitation_lr: float = 1e-3,
        imitation_weight: float = 1.0,
        imitation_steps: int = 1,
        teacher_forcing: float = 0.5,
        warm_start_finetune: bool = True,
        label_target: str = "initial",
        label_source: str = "embedding",
        grad_clip: float = 1.0,
        ppo: PPOConfig | None = None,
        lambda_lr: float = 0.1,
        lambda_gain: float = 0.5,
        lambda_damping: float = 0.0,
        lambda_init: float = 0.0,
        policy: str = "learned",
        policy_checkpoint: str | None = None,
        transfer_finetune: bool = False,
        entropy_thresholds: Sequence[float] | None = None,
        apt_search: str = "metric",
        eval_baselines: Sequence[str] | None = ("uniform", "random", "entropy"),
        init_checkpoint: str | None = None,
        sampling_seed: int = 0,
    ) -> None:
        """Settings (docs/budgets.md, comparison.md and detection.md measure them).

        Args:
            backbone: timm model name (a ViT or an EVA-02).
            pretrained: load timm's pretrained weights (needs the hub or its cache).
            checkpoint_path: local backbone weights for offline machines.
            backbone_kwargs: extra ``timm.create_model`` arguments (``img_size``, ``depth``, ...).
            levels: patch sizes coarse to fine; default: up to 3 levels that divide the image.
            target_fraction: the token budget: the mean token fraction training aims at and
                evaluation, test and predict deploy.
            budgets: ``[lowest, highest]``: one budget-conditioned policy for every budget in this
                range (points ``budget_step`` apart, one drawn per batch); None: ``target_fraction`` only.
            budget_step: spacing of the training budget points.
            max_fraction: hard cap on any image's token fraction at inference (None: no cap).
            eval_budgets: further budgets the learned policy is evaluated at, each with the baselines.
            calibration_images: training images that set the deployed cuts before each validation
                of a fit (0: the running average of training batches only).
            decision_dim: width of the decision module.
            decision_heads: heads of its cross-attention.
            decision_context: what a patch's decision reads: its ``children`` (the paper's) or its
                ``descendants`` (also the finest patches under it, the detail they alone resolve).
            attn_backend: packed-attention backend (``auto`` picks the fastest available).
            lr: learning rate of backbone, head and embeddings (dense and warm-start stages).
            weight_decay: AdamW weight decay (not on biases, norms, tokens and position embeddings).
            warmup_steps: linear warm-up steps of the task learning rate (then cosine to 0).
            policy_lr: learning rate of the decision module in PPO (small: λ must keep up).
            imitation_lr: learning rate of the decision module in the warm start.
            imitation_weight: weight of the warm-start BCE.
            imitation_steps: decision-module updates per warm-start batch (the extra ones re-run it alone).
            teacher_forcing: share of warm-start images laid out by the imitation labels instead of
                a sample of the policy.
            warm_start_finetune: fine-tune backbone, head and embeddings in the warm start (the
                paper); false trains the decision module alone.
            label_target: the patch embedding the imitation labels read: ``initial`` (a frozen copy
                as the warm start began) or ``live`` (the one being fine-tuned).
            label_source: what the warm start imitates: ``embedding`` differences (the paper's) or
                ``annotations`` (the oracle's layout from the data's boxes or masks: `annotated_cells`).
            grad_clip: gradient-norm clip of the task update.
            ppo: PPO settings.
            lambda_lr: integral step of the fraction controller.
            lambda_gain: proportional gain of the fraction controller.
            lambda_damping: derivative gain of the fraction controller.
            lambda_init: starting λ.
            policy: the layout policy this run trains and deploys: ``learned`` (SPLIT), ``entropy``
                (APT, fine-tuned on its layouts in the warm start, no PPO), ``random``, or
                ``transferred`` (``policy_checkpoint``'s decision module, frozen; docs/reuse.md).
            policy_checkpoint: the run a ``transferred`` policy comes from (folder, .ckpt, save_pretrained).
            transfer_finetune: PPO's epochs fine-tune a ``transferred`` policy (false: they cost nothing).
            entropy_thresholds: with ``policy: entropy``, APT's own per-level thresholds in bits,
                coarse to fine (APT lists them fine to coarse); null: cuts that meet ``target_fraction``.
            apt_search: how those cuts are set: ``metric`` (the lowest task loss at the budget on the
                calibration sample) or ``quantile`` (the same share of every level split).
            eval_baselines: rows beside the learned layout at its fraction (``oracle``: the annotations').
            init_checkpoint: weights to start from (a splitlab checkpoint, e.g. a ``dense`` run).
            sampling_seed: seed of the policy's sampling generator (its state is checkpointed).
        """
        super().__init__()
        self.save_hyperparameters()
        self.hparams.eval_budgets = list(eval_budgets or [])  # `null` means none, as `[]` does
        self.hparams.eval_baselines = eval_baselines = list(eval_baselines or [])
        self.automatic_optimization = False
        check_policy(policy, budgets, policy_checkpoint, transfer_finetune)
        check_warm_start(label_target, label_source, imitation_steps)
        check_baselines(eval_baselines)
        # PPO's settings: a PPOConfig, or a checkpoint's (or a recipe's) dict of them
        self.ppo = PPOConfig(**ppo) if isinstance(ppo, dict) else (ppo or PPOConfig())
        self.stage: Stage = "warm_start"
        self.sampling = SamplingStream(sampling_seed)
        self.configure_models()
        if policy == "transferred":  # another run's decision module, deployed frozen
            self.tokenizer.decision.load_state_dict(transferred_decision(policy_checkpoint, self.model))
        self.check_apt()
        self.sync_deployed()
        self.configure_metrics()
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)

    # ----------------------------------------------------------------------------- building
    def configure_models(self) -> None:
        """The deployable model (`SplitModel`: backbone, tokenizer, head) and the fraction controller."""
        hp = self.hparams
        self.model = self.model_class(model_settings(hp, self.model_class.head_keys))
        self.label_embedding = LabelEmbedding(self.backbone.model.patch_embed)  # the warm start's target
        points = self.model.tokenizer.operating_points.budgets.tolist()
        self.check_budgets()
        self.budget_sampler = BudgetSampler(len(points))
        self.controller = FractionController(  # λ per budget point
            points,
            hp.lambda_lr,
            hp.lambda_gain,
            hp.lambda_damping,
            lambda_init=hp.lambda_init,
            reduce=self.mean_over_ranks,
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
    def target_fraction(self) -> float:
        """The budget training aims at and inference deploys: the model's (one copy, kept there)."""
        return self.model.budget

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
    def unpack_batch(self, batch: Any) -> tuple[Tensor, Any]:
        """``(images, targets)`` of a batch."""
        return batch[0], batch[1]

    def repeat_targets(self, targets: Any, times: int) -> Any:
        """Targets for ``times`` rollouts of the batch, rollout after rollout."""
        return targets.repeat(times, *([1] * (targets.dim() - 1)))

    def per_image_loss(self, outputs: Any, targets: Any) -> Tensor:
        """The task loss of each image, shape ``(B,)``: its mean trains the task, its values are PPO rewards."""
        raise NotImplementedError

    def update_metrics(
        self, metrics: MetricCollection, outputs: Any, targets: Any, layout: TokenLayout
    ) -> None:
        """Feed one batch (and the layout it was computed on) to a metric collection."""
        raise NotImplementedError

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor | None:
        """``(B, rows, cols)`` bool: the finest cells a batch's annotations (boxes, masks) say need finest
        tokens, or None (the default); the ``oracle`` row and ``label_source: annotations`` read it."""
        return None

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
        """Task outputs and the layout used: ``policy``'s layout (default: deployed), `forward_layout`."""
        policy = self.deployed_policy if policy is None else policy
        layout = self.model.layout(images, budget, max_fraction, policy, seed)
        return self.forward_layout(layout), layout

    # ----------------------------------------------------------------------------- stages
    @property
    def deployed_policy(self) -> str:
        """What inference uses: the trained policy (``policy``), or the uniform grid while only dense
        training has run."""
        return "uniform" if self.stage == "dense" else DEPLOYS.get(self.hparams.policy, self.hparams.policy)

    def sync_deployed(self) -> None:
        """Tell the model which policy it deploys (and so which one its hard cap binds)."""
        self.model.policy = self.deployed_policy

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

    # ----------------------------------------------------------------------------- what runs when
    def on_train_start(self) -> None:
        if self.hparams.policy == "entropy":  # APT trains at its fixed cuts too
            self.recalibrate()

    def on_train_epoch_start(self) -> None:
        if self.apt_pending():  # a dense stage ran first in this fit: its backbone is ready now
            self.recalibrate()

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self.recalibrate()  # the deployed cuts of the policy as trained so far
        self.note_unreachable_budgets()

    def on_test_start(self) -> None:
        self.note_unreachable_budgets()
