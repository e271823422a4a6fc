"""`SplitTask`: the LightningModule every task builds on (stages, optimizers, evaluation, summary)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.backbone import PackedFeatures, PackedViT
from splitlab.rl import FractionController, PPOConfig, advantages, ppo_policy_loss, warm_start_labels
from splitlab.tasks.evaluation import PolicyStats, format_table, summary_record, timed, write_summary
from splitlab.tokenizer import (
    BASELINES,
    Levels,
    SplitTokenizer,
    TokenLayout,
    baseline_scores,
    build_layout,
    fraction_of,
)

Stage = Literal["dense", "warm_start", "ppo"]
STAGES = ("dense", "warm_start", "ppo")


class SplitTask(LightningModule):
    """A SPLIT model for one task: tokenizer + `PackedViT` + task head, trained in stages.

    Stages (set by `splitlab.callbacks.SplitSchedule`):

    - ``dense``: the backbone and head train on the uniform finest grid (pretraining a backbone
      that has no pretrained weights, e.g. in CI).
    - ``warm_start``: the decision module imitates embedding-difference labels (BCE) while the
      backbone and head fine-tune on mixed-resolution layouts sampled from that policy.
    - ``ppo``: backbone, head and embeddings are frozen; the decision module alone learns from
      reward = -per-sample task loss - λ·token fraction, λ held by a `FractionController`.

    Subclasses supply the head (`configure_head`), the per-sample loss and the metrics; the
    stage logic lives here once. Optimisation is manual (two optimizers: task and policy), as
    PPO needs several updates per batch.

    Args:
        backbone: timm model name (or a built `VisionTransformer`).
        pretrained: load timm's pretrained weights (needs the hub or its cache).
        checkpoint_path: local backbone weights for offline machines.
        backbone_kwargs: extra ``timm.create_model`` arguments (``img_size``, ``depth``, ...).
        levels: patch sizes coarse to fine; default: up to 3 levels that divide the image.
        target_fraction: target mean token fraction.
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
        grad_clip: gradient-norm clip of the task update.
        ppo: PPO settings.
        lambda_lr: integral step of the fraction controller.
        lambda_gain: proportional gain of the fraction controller.
        lambda_damping: derivative gain of the fraction controller.
        lambda_init: starting λ.
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
        decision_dim: int = 128,
        decision_heads: int = 4,
        attn_backend: str = "auto",
        lr: float = 1e-4,
        weight_decay: float = 0.05,
        warmup_steps: int = 0,
        policy_lr: float = 3e-4,
        imitation_lr: float = 1e-3,
        imitation_weight: float = 1.0,
        grad_clip: float = 1.0,
        ppo: PPOConfig | None = None,
        lambda_lr: float = 0.1,
        lambda_gain: float = 0.5,
        lambda_damping: float = 0.0,
        lambda_init: float = 0.0,
        eval_baselines: Sequence[str] = ("uniform", "random", "entropy"),
        init_checkpoint: str | None = None,
        sampling_seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        unknown = [b for b in eval_baselines if b not in BASELINES]
        if unknown:
            raise ValueError(
                f"eval_baselines={list(eval_baselines)}: unknown {unknown}; choose from {BASELINES}"
            )
        self.ppo = ppo or PPOConfig()
        self.stage: Stage = "warm_start"
        self.configure_models()
        self.configure_losses()
        self.configure_metrics()
        self._generator: torch.Generator | None = None
        self._pending_generator_state: Tensor | None = None
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
        self.tokenizer = SplitTokenizer(
            self.backbone.embed_dim, self.levels, hp.decision_dim, hp.decision_heads
        )
        self.head = self.configure_head()
        self.controller = FractionController(
            self.target_fraction,
            lr=hp.lambda_lr,
            gain=hp.lambda_gain,
            damping=hp.lambda_damping,
            lambda_init=hp.lambda_init,
            reduce=self._mean_over_ranks,
        )

    def configure_head(self) -> nn.Module | None:
        """The task head on top of `PackedFeatures` (None when the timm model's own head is used)."""
        return None

    def configure_losses(self) -> None:
        """Loss modules; the contract is `per_sample_loss`."""

    def configure_metrics(self) -> None:
        """Per-policy metric collections for validation and test."""
        policies = ["learned", *self.hparams.eval_baselines]
        for split in ("val", "test"):
            stats = nn.ModuleDict({p: PolicyStats(self.build_metrics()) for p in policies})
            setattr(self, f"{split}_stats", stats)

    def build_metrics(self) -> MetricCollection:
        """A fresh metric collection of the task (keys are metric names, one is `metric_name`)."""
        raise NotImplementedError

    def load_init_checkpoint(self, path: str) -> None:
        """Start from a splitlab (or plain) state dict; tokenizer and controller may be absent."""
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"init_checkpoint={path!r}: no such file")
        state = torch.load(file, map_location="cpu", weights_only=False)
        state = state.get("state_dict", state)
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(("tokenizer.", "controller."))]
        if missing or unexpected:
            raise ValueError(
                f"init_checkpoint={path!r} does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )

    # ----------------------------------------------------------------------------- task API
    def split_batch(self, batch: Any) -> tuple[Tensor, Any]:
        """``(images, targets)`` of a batch."""
        return batch[0], batch[1]

    def repeat_targets(self, targets: Any, times: int) -> Any:
        """Targets for ``times`` rollouts of the batch, rollout after rollout."""
        return targets.repeat(times, *([1] * (targets.dim() - 1)))

    def forward_task(self, features: PackedFeatures) -> Any:
        """Task outputs from backbone features."""
        raise NotImplementedError

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
        self, images: Tensor, policy: str = "learned", fraction: float | None = None, seed: int = 0
    ) -> TokenLayout:
        """A layout for ``images``: the learned policy (threshold mode) or a baseline at ``fraction``."""
        if policy == "learned":
            return self.tokenizer(images, self.backbone, mode="threshold")
        generator = torch.Generator(images.device).manual_seed(seed)
        mean, std = self._normalisation()
        scores, threshold = baseline_scores(
            policy, images, self.levels, fraction=fraction, generator=generator, mean=mean, std=std
        )
        return self.tokenizer(images, self.backbone, mode="scores", scores=scores, threshold=threshold)

    def forward(
        self, images: Tensor, policy: str = "learned", fraction: float | None = None, seed: int = 0
    ) -> tuple[Any, TokenLayout]:
        """Task outputs and the layout used, for inference (``seed`` drives the random baseline)."""
        layout = self.layout(images, policy, fraction, seed)
        return self.forward_task(self.backbone(layout, indices=self.backbone_indices())), layout

    def _normalisation(self) -> tuple[Sequence[float], Sequence[float]]:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "mean") and hasattr(dm, "std"):
            return dm.mean, dm.std
        cfg = self.backbone.data_config
        return cfg["mean"], cfg["std"]

    # ----------------------------------------------------------------------------- stages
    @property
    def deployed_policy(self) -> str:
        """What inference uses: the learned policy, or the uniform grid while only dense training has run."""
        return "uniform" if self.stage == "dense" else "learned"

    def set_stage(self, stage: Stage) -> None:
        """Enter a stage: PPO freezes backbone, head and embeddings (and puts them in eval mode)."""
        if stage not in STAGES:
            raise ValueError(f"stage={stage!r}: expected one of {STAGES}")
        self.stage = stage
        if self._trainer is not None and self.trainer.optimizers:
            policy_opt = self.trainer.optimizers[1]
            for group in policy_opt.param_groups:
                group["lr"] = self.hparams.policy_lr if stage == "ppo" else self.hparams.imitation_lr
        trainable = stage != "ppo"
        for module in self.task_modules():
            module.requires_grad_(trainable)
            module.train(trainable and self.training)

    def task_modules(self) -> list[nn.Module]:
        """What the task optimizer trains and PPO freezes."""
        modules: list[nn.Module] = [self.backbone, self.tokenizer.embed]
        if self.head is not None:
            modules.append(self.head)
        return modules

    def train(self, mode: bool = True) -> SplitTask:
        super().train(mode)
        if mode and self.stage == "ppo":  # frozen parts stay deterministic: no dropout in rewards
            for module in self.task_modules():
                module.eval()
        return self

    @property
    def generator(self) -> torch.Generator:
        """The policy's sampling generator (seeded, checkpointed, on the model's device)."""
        if self._generator is None or self._generator.device != self.device:
            self._generator = torch.Generator(self.device).manual_seed(int(self.hparams.sampling_seed))
            if self._pending_generator_state is not None:
                self._generator.set_state(self._pending_generator_state)
                self._pending_generator_state = None
        return self._generator

    def _mean_over_ranks(self, value: Tensor) -> Tensor:
        if self._trainer is None or self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(value, reduce_op="mean")

    # ----------------------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        decay, no_decay = [], []
        skip = {f"model.{n}" for n in getattr(self.backbone.model, "no_weight_decay", lambda: set())()}
        for module in self.task_modules():
            for name, param in module.named_parameters():
                (no_decay if param.ndim <= 1 or name in skip or "level_embed" in name else decay).append(
                    param
                )
        task_opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
        )
        policy_opt = torch.optim.Adam(self.tokenizer.decision.parameters(), lr=hp.policy_lr)
        total = max(self._stage_steps("supervised"), 1)
        self._ppo_total_steps = max(self._stage_steps("ppo"), 1)
        warmup = min(hp.warmup_steps, total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        task_sched = torch.optim.lr_scheduler.LambdaLR(task_opt, schedule)
        return [task_opt, policy_opt], [task_sched]

    def _stage_steps(self, which: str) -> int:
        """Batches the supervised stages (dense + warm start) or PPO will see in this fit."""
        from splitlab.callbacks.schedule import SplitSchedule

        trainer = self.trainer
        sched = next((c for c in trainer.callbacks if isinstance(c, SplitSchedule)), None)
        if sched is None or not trainer.max_epochs or trainer.max_epochs < 1:
            return int(trainer.estimated_stepping_batches)
        per_epoch = math.ceil(trainer.estimated_stepping_batches / trainer.max_epochs)
        if which == "supervised":
            return per_epoch * (sched.dense_epochs + sched.warm_start_epochs)
        return per_epoch * (trainer.max_epochs - sched.dense_epochs - sched.warm_start_epochs)

    def _policy_lr(self) -> float:
        """PPO's learning rate, annealed (cosine to 5%) over the PPO batches.

        Late in PPO the policy should settle where λ holds it: a fast-moving policy at the end
        leaves the deployed fraction wherever the last oscillation put it. The PPO step count is
        the controller's (checkpointed) step counter, so the schedule survives resume.
        """
        total = getattr(self, "_ppo_total_steps", 1)
        progress = min(int(self.controller.steps) / total, 1.0)
        return self.hparams.policy_lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))

    def backward_synced(self, loss: Tensor, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """``manual_backward``, then one coalesced all-reduce (mean) of the optimizers' gradients under DDP.

        DDP's reducer needs every trainable parameter to receive a gradient in every backward
        (or ``find_unused_parameters``, a graph walk per step). Here the used set depends on the
        data (a level with no kept token on one rank gives its embedding no gradient) and on the
        stage (PPO's K backward passes touch only the decision module), so the backward runs
        without DDP's sync and the gradients are averaged here: missing ones count as zero, so
        every rank applies the same update. In PPO only the small policy is communicated.
        """
        model = self.trainer.model if self._trainer is not None else None
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            self.manual_backward(loss)
            return
        with model.no_sync():
            self.manual_backward(loss)
        params = [
            p for opt in optimizers for group in opt.param_groups for p in group["params"] if p.requires_grad
        ]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        torch.distributed.all_reduce(flat)
        flat /= torch.distributed.get_world_size()
        for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            p.grad = g

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        images, targets = self.split_batch(batch)
        if self.stage == "ppo":
            stats = self.ppo_step(images, targets)
        else:
            stats = self.supervised_step(images, targets)
        batch_size = images.shape[0]
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=batch_size)
        self.log("lambda", self.controller.value, prog_bar=True, batch_size=batch_size)
        return stats["loss"]

    def supervised_step(self, images: Tensor, targets: Any) -> dict[str, Tensor]:
        """Dense or warm-start step: task loss on layouts (+ imitation BCE in the warm start)."""
        task_opt, policy_opt = self.optimizers()
        task_sched = self.lr_schedulers()
        tokens, content = self.tokenizer.embed(images, self.backbone)
        stats: dict[str, Tensor] = {}
        if self.stage == "dense":
            layout = build_layout(
                tokens, [torch.ones(t.shape[:3], dtype=torch.bool) for t in tokens[:-1]], self.levels
            )
            imitation = None
        else:
            logits = self.tokenizer.decision_logits(tokens)
            labels, _ = warm_start_labels(content, self.levels, self.target_fraction)
            imitation = sum(
                F.binary_cross_entropy_with_logits(lg.float(), lab.float(), reduction="sum")
                for lg, lab in zip(logits, labels, strict=True)
            ) / sum(lab.numel() for lab in labels)
            # The backbone fine-tunes on layouts *sampled from the policy* rather than on the labels:
            # PPO's rollouts and the deployed threshold layouts come from this policy, so the backbone
            # learns the distribution it will be frozen on, and sampling's variety keeps it robust to
            # PPO's exploration. The labels only teach the policy (BCE).
            with torch.no_grad():
                decisions = [
                    torch.bernoulli(torch.sigmoid(lg.float()), generator=self.generator).bool()
                    for lg in logits
                ]
            layout = build_layout(tokens, decisions, self.levels)
            stats["imitation"] = imitation.detach()
            stats["label_agreement"] = torch.stack(
                [((lg > 0) == lab).float().mean() for lg, lab in zip(logits, labels, strict=True)]
            ).mean()
        outputs = self.forward_task(self.backbone(layout, indices=self.backbone_indices()))
        task_loss = self.per_sample_loss(outputs, targets).mean()
        loss = task_loss if imitation is None else task_loss + self.hparams.imitation_weight * imitation
        task_opt.zero_grad()
        policy_opt.zero_grad()
        self.backward_synced(loss, [task_opt, policy_opt])
        self.clip_gradients(
            task_opt, gradient_clip_val=self.hparams.grad_clip, gradient_clip_algorithm="norm"
        )
        task_opt.step()
        if imitation is not None:
            policy_opt.step()
        task_sched.step()
        stats.update(loss=loss.detach(), task_loss=task_loss.detach(), fraction=layout.fraction.mean())
        return stats

    def ppo_step(self, images: Tensor, targets: Any) -> dict[str, Tensor]:
        """Roll out sampled layouts, score them with the frozen model, update the policy K times."""
        _, policy_opt = self.optimizers()
        for group in policy_opt.param_groups:
            group["lr"] = self._policy_lr()
        cfg = self.ppo
        samples = cfg.samples
        with torch.no_grad():
            tokens, _ = self.tokenizer.embed(images, self.backbone)
            old_logits = self.tokenizer.decision_logits(tokens)
            rep_tokens = [t.repeat(samples, 1, 1, 1) for t in tokens]
            rep_logits = [lg.repeat(samples, 1, 1) for lg in old_logits]
            decisions = [
                torch.bernoulli(torch.sigmoid(lg.float()), generator=self.generator).bool()
                for lg in rep_logits
            ]
            layout = build_layout(rep_tokens, decisions, self.levels, rep_logits)
            outputs = self.forward_task(self.backbone(layout, indices=self.backbone_indices()))
            task_loss = self.per_sample_loss(outputs, self.repeat_targets(targets, samples)).float()
            lam = self.controller.value
            reward = -task_loss - lam * layout.fraction
            advantage = advantages(reward.view(samples, -1), reduce_mean=self._mean_over_ranks).reshape(-1)
            deployed = fraction_of([lg > 0 for lg in old_logits])
        for _ in range(cfg.epochs):
            new_logits = [lg.repeat(samples, 1, 1) for lg in self.tokenizer.decision_logits(tokens)]
            loss, ppo_stats = ppo_policy_loss(
                new_logits,
                rep_logits,
                layout.decisions,
                layout.candidates,
                advantage,
                cfg.clip,
                cfg.entropy_coef,
            )
            policy_opt.zero_grad()
            self.backward_synced(loss, [policy_opt])
            self.clip_gradients(
                policy_opt, gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm"
            )
            policy_opt.step()
        self.controller.update(deployed.mean())
        return {
            "loss": loss.detach(),
            "task_loss": task_loss.mean(),
            "reward": reward.mean(),
            "fraction": layout.fraction.mean(),
            "deployed_fraction": deployed.mean(),
            **ppo_stats,
        }

    # ----------------------------------------------------------------------------- evaluation
    def _evaluate_baselines(self) -> bool:
        trainer = self.trainer
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != "fit":
            return True
        return trainer.current_epoch + 1 >= (trainer.max_epochs or 0)

    def _eval_step(self, batch: Any, batch_idx: int, split: str) -> dict[str, Any]:
        images, targets = self.split_batch(batch)
        stats = getattr(self, f"{split}_stats")
        with timed(images.device) as elapsed:
            outputs, layout = self(images, policy=self.deployed_policy)
        learned = stats["learned"]
        learned.update_layout(layout.fraction, elapsed())
        self.update_metrics(learned.metrics, outputs, targets, layout)
        if self._evaluate_baselines():
            realised = float(layout.fraction.mean())
            for policy in self.hparams.eval_baselines:
                if policy == self.deployed_policy:
                    continue
                with timed(images.device) as elapsed:
                    base_out, base_layout = self(
                        images,
                        policy=policy,
                        fraction=max(realised, self.levels.min_fraction),
                        seed=batch_idx,
                    )
                stats[policy].update_layout(base_layout.fraction, elapsed())
                self.update_metrics(stats[policy].metrics, base_out, targets, base_layout)
        return {"images": images, "layout": layout} if batch_idx == 0 else {}

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "test")

    def _eval_epoch_end(self, split: str) -> None:
        stats = getattr(self, f"{split}_stats")
        results = {}
        for policy, stat in stats.items():
            if not stat.images.update_called:
                stat.reset()
                continue
            results[policy] = stat.compute()
            stat.reset()
        if "learned" not in results:
            return
        learned = results["learned"]
        self.log(
            f"{split}/{self.metric_name}",
            learned.get(self.metric_name, float("nan")),
            prog_bar=True,
            sync_dist=False,
        )
        self.log(f"{split}/fraction", learned["token_fraction_mean"], prog_bar=True)
        self.log(f"{split}/fraction_std", learned["token_fraction_std"], prog_bar=True)
        self.log("lambda", self.controller.value, prog_bar=True)
        for policy, values in results.items():
            if policy != "learned":
                self.log(f"{split}/{policy}/{self.metric_name}", values.get(self.metric_name, float("nan")))
                self.log(f"{split}/{policy}/fraction", values["token_fraction_mean"])
        if not self._evaluate_baselines():  # the summary is written at the end of fit, validate and test
            return
        if self.deployed_policy != "learned":  # a dense (pretraining) run deploys the uniform grid
            results = {self.deployed_policy: results.pop("learned"), **results}
        record = summary_record(
            self.task_name,
            self.metric_name,
            self.target_fraction,
            self.controller.value,
            results,
            str(self.trainer.state.fn.value),
        )
        self.last_summary = record
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir
        if self.trainer.is_global_zero:
            write_summary(record, log_dir)
            rank_zero_info("\n" + format_table(record))

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Each image's layout (token boxes in pixels, levels, fraction) and the task output."""
        images, _ = self.split_batch(batch) if isinstance(batch, list | tuple) else (batch, None)
        outputs, layout = self(images)
        finest = self.levels.finest
        records = []
        for i, (boxes, levels) in enumerate(
            zip(layout.split(layout.boxes), layout.split(layout.level), strict=True)
        ):
            records.append(
                {
                    "batch": batch_idx,
                    "index": i,
                    "token_fraction": float(layout.fraction[i]),
                    "tokens": [
                        [*(b * finest).tolist(), int(lv)] for b, lv in zip(boxes, levels, strict=True)
                    ],
                    "prediction": self.describe_prediction(outputs, i),
                }
            )
        return records

    def describe_prediction(self, outputs: Any, index: int) -> Any:
        """A JSON-friendly summary of one image's prediction."""
        return None

    def configure_callbacks(self) -> list[Any]:
        """Mid-epoch resumes continue at the exact sample (`ResumePosition`); ``predict`` writes each
        image's layout (`LayoutWriter`, unless the trainer already has one)."""
        from splitlab.callbacks.cluster import ResumePosition
        from splitlab.callbacks.predictions import LayoutWriter

        callbacks: list[Any] = [ResumePosition()]
        if self._trainer is None or not any(isinstance(c, LayoutWriter) for c in self.trainer.callbacks):
            callbacks.append(LayoutWriter())
        return callbacks

    # ----------------------------------------------------------------------------- checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["splitlab"] = {
            "task_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "stage": self.stage,
            "generator": self.generator.get_state(),
            "levels": list(self.levels.sizes),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("splitlab", {})
        if "stage" in state:
            self.stage = state["stage"]
        if "generator" in state:
            self._generator = None
            self._pending_generator_state = state["generator"]


def load_task(path: str | Path, map_location: Any = "cpu") -> SplitTask:
    """Load any splitlab task checkpoint (the task class is recorded in it)."""
    import importlib

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r}: no such file")
    meta = torch.load(file, map_location="cpu", weights_only=False).get("splitlab", {})
    if "task_class" not in meta:
        raise ValueError(f"checkpoint {str(path)!r} was not written by a splitlab task")
    module, _, name = meta["task_class"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls.load_from_checkpoint(file, map_location=map_location)
