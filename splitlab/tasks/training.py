"""Stage-aware training of a `SplitTask`: the stages, the dense / warm-start step, PPO's step, and
the budget each batch trains at."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from splitlab.lightning_private import attached_trainer
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.optimization import Optimization
from splitlab.tokenizer import (
    annotation_labels,
    calibrate_threshold,
    fraction_of,
    gain_labels,
    policy,
    warm_start_labels,
)
from splitlab.training import imitation_loss, per_image_shares, policy_loss, roll_out
from splitlab.training.progress import Stage

ANCHORED_SOURCES = ("annotations", "loss", "fidelity")  # labels PPO stays anchored to by default

RUN_CALLBACKS_GROUP = "splitlab.run_callbacks"  # pyproject.toml's entry points: who adds run callbacks


def run_callbacks(given: Sequence[Any], fitting: bool) -> list[Any]:
    """The run callbacks ``given`` lacks, from every provider of the `RUN_CALLBACKS_GROUP` entry points
    (splitlab's own: `splitlab.callbacks.run.missing_run_callbacks`): tasks/ imports no callback, the
    installed package names them. A checkout used without ``pip install`` has none: it says so."""
    providers = entry_points(group=RUN_CALLBACKS_GROUP)
    if not providers:
        rank_zero_warn(
            "splitlab is not installed (no splitlab.run_callbacks entry points): Trainer().fit(task) runs "
            "without its stage schedule and run callbacks; pip install -e . in the checkout"
        )
    added: list[Any] = []
    for provider in sorted(providers, key=lambda p: p.name != "splitlab"):  # splitlab's own first
        added += provider.load()([*given, *added], fitting)
    return added


class StageTraining(Optimization):
    """Which stage runs, and one training step of each: dense, warm start (imitation), PPO.

    Builds on `Optimization` (its optimizers, learning rates and gradient sync); uses of its task
    only what `SplitTask` defines (model parts, ``stage``, ``controller``, ``budget_sampler``, the
    task API) and Lightning's.
    """

    def configure_callbacks(self) -> list[Any]:
        """The run's callbacks the trainer lacks (`splitlab.callbacks.RUN_CALLBACKS`): the stage
        schedule, exact resume, the checkpoint on a stop, skipped-sample counts, verified checkpoint
        writes. ``Trainer().fit(task, data)`` from Python so trains what ``lightning fit`` trains
        (warm start, then PPO); callbacks the user passes, a `SplitSchedule` included, win."""
        return run_callbacks(self.trainer.callbacks, fitting=self.trainer.state.fn == "fit")

    def set_stage(self, stage: Stage) -> None:
        """Enter a stage: PPO freezes backbone, head and embeddings (and puts them in eval mode)."""
        self.progress.enter(stage)
        self.sync_deployed()
        trainable = not self.task_frozen
        self.set_policy_lr(stage)
        if not trainable and attached_trainer(self) is not None and self.trainer.optimizers:
            self.trainer.optimizers[0].zero_grad(set_to_none=True)  # else they stay allocated all stage
        for module in self.task_modules():
            module.requires_grad_(trainable)
            module.train(trainable and self.training)

    @property
    def policy_trains(self) -> bool:
        """Whether this stage updates the decision module (`Progress.policy_trains`)."""
        hp = self.hparams
        return self.progress.policy_trains(hp.policy, bool(hp.policy_options.transfer_finetune))

    @property
    def task_frozen(self) -> bool:
        """Whether this stage leaves backbone, head and embeddings as they are (`Progress.task_frozen`)."""
        return self.progress.task_frozen(bool(self.hparams.warm_start.finetune))

    def train(self, mode: bool = True) -> StageTraining:
        super().train(mode)
        if mode and self.task_frozen:  # frozen parts stay deterministic: no dropout in rewards
            for module in self.task_modules():
                module.eval()
        return self

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        images, targets = self.unpack_batch(batch)
        if self.task_frozen and not self.policy_trains:
            return None  # nothing learns: a fixed (or frozen transferred) policy with the task frozen
        if self.stage == "ppo":
            stats = self.ppo_step(images, targets, batch)
        else:
            stats = self.supervised_step(images, targets, batch)
        batch_size = images.shape[0]
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=batch_size)
        self.log("lambda", self.controller.value_at(self.budget), prog_bar=True, batch_size=batch_size)
        return stats["loss"]

    def supervised_step(self, images: Tensor, targets: Any, batch: Any = None) -> dict[str, Tensor]:
        """Dense or warm-start step: task loss on layouts (+ imitation BCE in the warm start)."""
        task_opt, policy_opt = self.optimizers()
        task_sched = self.lr_schedulers()
        tokens, _ = self.tokenizer.embed(images, self.backbone)
        stats: dict[str, Tensor] = {}
        if self.stage == "dense":
            uniform = [t.new_ones(t.shape[:3]) for t in tokens[:-1]]
            layout = self.tokenizer.tokenize(tokens, "scores", scores=uniform, threshold=0.0)
            imitation = None
        elif self.hparams.policy == "transferred":  # fine-tuned on the frozen policy's deployed layouts
            point, budget = self.step_budget()
            with torch.no_grad():
                logits = self.tokenizer.decision_logits(tokens, budget)
            stats["deployed_fraction"] = self.calibrate(logits, point, budget, tokens[-1].shape[1:3]).mean()
            layout = self.tokenizer.tokenize(tokens, "threshold", logits=logits, budget=budget)
            imitation = None
        elif self.hparams.policy != "learned":  # APT and random, fine-tuned on their own layouts
            scores, cut = self.model.scores(self.hparams.policy, images, self.budget, self.generator)
            layout = self.tokenizer.tokenize(tokens, "scores", scores=scores, threshold=cut)
            imitation = None
        else:
            point, budget = self.step_budget()
            logits = self.tokenizer.decision_logits(tokens, budget)
            labels = self.imitation_labels(images, batch, budget, tokens)
            imitation = self.imitation_loss(logits, labels)
            # The backbone fine-tunes on a mix of label layouts and policy samples (see there why).
            layout = self.warm_start_layout(tokens, logits, labels)
            stats["deployed_fraction"] = self.calibrate(logits, point, budget, tokens[-1].shape[1:3]).mean()
            stats["label_agreement"] = torch.stack(
                [((lg > 0) == lab).float().mean() for lg, lab in zip(logits, labels, strict=True)]
            ).mean()
        frozen = self.task_frozen  # a warm start that trains the decision module alone
        with torch.no_grad() if frozen else contextlib.nullcontext():  # the task loss is then a statistic
            outputs = self.forward_layout(layout)
            task_loss = self.per_image_loss(outputs, targets).mean()
        if frozen:
            loss = self.hparams.warm_start.imitation_weight * imitation
        else:
            loss = (
                task_loss
                if imitation is None
                else task_loss + self.hparams.warm_start.imitation_weight * imitation
            )
        task_opt.zero_grad()
        policy_opt.zero_grad()
        self.backward_synced(loss, [policy_opt] if frozen else [task_opt, policy_opt])
        if not frozen:
            self.clip_norm(task_opt, self.hparams.optim.grad_clip)
            task_opt.step()
            task_sched.step()
        if imitation is not None:
            policy_opt.step()
            for _ in range(self.hparams.warm_start.imitation_steps - 1):
                imitation = self.imitation_update(tokens, labels, budget, policy_opt)
            stats["imitation"] = imitation.detach()
            self.budget_sampler.update(point, task_loss.detach(), self.mean_over_ranks)
        stats.update(loss=loss.detach(), task_loss=task_loss.detach(), fraction=layout.fraction.mean())
        return stats

    def step_budget(self) -> tuple[int, float]:
        """This step's training budget: the one target, or (budget-conditioned) a point drawn per batch,
        more often where it costs more task loss than the cheapest point (`BudgetSampler`).

        The draw is a function of ``(sampling_seed, global_step)`` and of reduced loss averages:
        the same on every rank (λ and the operating points are kept per point and must agree)
        and the same after a resume.
        """
        points = self.controller.budgets
        if len(points) == 1:
            return 0, points[0]
        point = self.budget_sampler.draw(
            int(self.hparams.policy_options.sampling_seed) * 1_000_003 + int(self.global_step)
        )
        return point, points[point]

    def calibrate(self, logits: Sequence[Tensor], point: int, budget: float, finest: Sequence[int]) -> Tensor:
        """Move the operating point of ``budget`` towards this batch's exact cut; the deployed fractions
        (of the ``finest`` grid)."""
        logits = [lg.detach() for lg in logits]
        self.tokenizer.operating_points.update(
            point, calibrate_threshold(logits, budget, finest=finest), self.mean_over_ranks
        )
        cut = self.tokenizer.operating_points.cuts[point]
        return fraction_of([lg > cut for lg in logits], finest)

    imitation_loss = staticmethod(imitation_loss)  # `splitlab.training.imitation_loss`, the one

    def imitation_update(
        self, tokens: Sequence[Tensor], labels: Sequence[Tensor], budget: float, policy_opt: Any
    ) -> Tensor:
        """One more update of the decision module alone on a warm-start batch (``imitation_steps``):
        the embeddings and labels are the batch's, only the small module runs again."""
        imitation = self.imitation_loss(
            self.tokenizer.decision_logits([t.detach() for t in tokens], budget), labels
        )
        policy_opt.zero_grad()
        self.backward_synced(self.hparams.warm_start.imitation_weight * imitation, [policy_opt])
        policy_opt.step()
        return imitation

    def anchor_weight(self) -> float:
        """PPO's weight on the warm start's imitation loss (``ppo.imitation``); by default 1.0 where the
        labels read the task (``annotations``, ``loss``, ``fidelity``) and 0 where they are a proxy:
        anchored to embedding-difference labels the classification twin without annotations kept
        0.878-0.885 top-1 at half the tokens, unanchored 0.983-0.997 (docs/oracle.md); anchored to
        fidelity labels (raw gains) hard ADE20K seed 0 kept 0.477 mIoU at 0.3, 0.463 unanchored
        (docs/loss_labels.md)."""
        if self.hparams.ppo.imitation is not None:
            return float(self.hparams.ppo.imitation)
        return 1.0 if self.hparams.warm_start.label_source in ANCHORED_SOURCES else 0.0

    def check_label_source(self) -> None:
        """Refuse, at construction, warm-start labels this task cannot give: ``fidelity`` reads the
        task's own prediction as targets (`TaskLogic.own_targets`)."""
        if self.hparams.warm_start.label_source != "fidelity":
            return
        if type(self.logic).own_targets is TaskLogic.own_targets:
            raise ValueError(
                f"warm_start.label_source=fidelity: {type(self).__name__} has no targets of its own "
                "prediction (TaskLogic.own_targets); use label_source=loss or embedding"
            )

    def imitation_labels(
        self, images: Tensor, batch: Any, budget: float, tokens: list[Tensor] | None = None
    ) -> list[Tensor]:
        """The warm start's split labels at ``budget`` (``label_source``): from embedding differences
        (the paper's), the oracle's layout from the batch's annotations, the splits worth most to the
        task loss of the model as it is now (``loss``) or that keep its outputs closest to its own on
        the finest grid (``fidelity``), or APT's layout (``entropy``); ``tokens``: the batch's
        embeddings, if at hand."""
        source = self.hparams.warm_start.label_source
        if source in ("loss", "fidelity"):
            _, targets = self.unpack_batch(batch)
            gains = per_image_shares(
                self.loss_gains(images, targets, tokens=tokens, own=source == "fidelity")
            )
            return gain_labels(gains, self.levels, budget, self.levels.finest_grid(images.shape[-2:]))
        if source == "entropy":  # APT's layout at the budget: pixel entropy, no annotations, no model
            scores, cut = self.model.scores("entropy", images, budget, self.generator)
            return [level > cut for level in scores]
        if source not in ("annotations", "embedding"):  # never a silent fallback to another source
            raise ValueError(f"warm_start.label_source={source!r}: no labels of that kind")
        if source == "annotations":
            grid = self.levels.grid(self.levels.num - 1, tuple(images.shape[-2:]))
            cells = self.annotated_cells(batch, grid)
            if cells is None:
                raise ValueError(
                    f"label_source=annotations: this batch gives no annotations ({type(self).__name__})"
                )
            return annotation_labels(cells.to(images.device), self.levels, budget, self.generator)[0]
        return warm_start_labels(self.label_content(images), self.levels, budget)[0]

    def label_content(self, images: Tensor) -> list[Tensor]:
        """The patch-content embeddings the imitation labels read (``label_target``): a frozen copy of
        the patch embedding, taken at the warm start's first step, or the live one."""
        if self.hparams.warm_start.label_target == "live":
            return self.tokenizer.embed.content(images, self.backbone)
        if not self.label_embedding.ready:
            self.label_embedding.take(self.backbone.model.patch_embed)
        return self.tokenizer.embed.content(images, self.label_embedding)

    def warm_start_layout(self, tokens: list[Tensor], logits: list[Tensor], labels: list[Tensor]) -> Any:
        """The layouts the backbone fine-tunes on in the warm start: per image, the imitation labels
        (with probability ``teacher_forcing``) or a sample of the policy.

        Samples are what PPO's rollouts and deployment will show the frozen backbone, and their
        variety keeps it robust to PPO's exploration; label layouts keep the objects at fine
        resolution while the policy is still random, which a backbone fine-tuned on random layouts
        alone loses. What each share costs, and the variants tried: docs/comparison.md and
        docs/budgets.md.
        """
        share = float(self.hparams.warm_start.teacher_forcing)
        if share <= 0:
            return self.tokenizer.tokenize(tokens, "sample", logits=logits, generator=self.generator)
        sampled = policy.sample(logits, self.generator)
        batch, device = tokens[0].shape[0], tokens[0].device
        teacher = torch.rand(batch, generator=self.generator, device=device) < share
        mixed = [
            torch.where(teacher.view(-1, 1, 1), lab, smp) for lab, smp in zip(labels, sampled, strict=True)
        ]
        return self.tokenizer.tokenize(tokens, "labels", labels=mixed, logits=logits)

    def kl_stop(self, epoch: int, approx_kl: Tensor) -> bool:
        """Whether PPO's ``target_kl`` ends the batch's policy epochs (the same decision on every rank)."""
        target = self.hparams.ppo.target_kl
        return target is not None and epoch > 0 and float(self.mean_over_ranks(approx_kl)) > 1.5 * target

    def ppo_step(self, images: Tensor, targets: Any, batch: Any = None) -> dict[str, Tensor]:
        """Roll out sampled layouts, score them with the frozen model, update the policy K times."""
        _, policy_opt = self.optimizers()
        self.set_policy_lr("ppo")
        cfg = self.hparams.ppo
        samples = cfg.samples
        point, budget = self.step_budget()
        lam = float(self.controller.values[point])
        rolled = roll_out(
            self.model,
            images,
            budget,
            lam,
            samples,
            lambda layouts: self.per_image_loss(
                self.forward_layout(layouts), self.repeat_targets(targets, samples)
            ),
            self.generator,
            self.mean_over_ranks,
        )
        tokens, rollouts, task_loss, reward = rolled.tokens, rolled.layouts, rolled.task_loss, rolled.reward
        anchor = self.anchor_weight()
        labels = self.imitation_labels(images, batch, budget, tokens) if anchor > 0 else None
        epochs_run = 0
        for epoch in range(cfg.epochs):
            loss, ppo_stats, logits = policy_loss(self.model, rolled, budget, cfg)
            if labels is not None:  # the warm start's labels as an anchor
                imitation = self.imitation_loss(logits, labels)
                ppo_stats["imitation"] = imitation.detach()
                loss = loss + anchor * imitation
            if self.kl_stop(epoch, ppo_stats["approx_kl"]):
                break
            policy_opt.zero_grad()
            self.backward_synced(loss, [policy_opt])
            self.clip_norm(policy_opt, cfg.max_grad_norm)
            policy_opt.step()
            epochs_run += 1
        self.progress.count_ppo_step()
        self.controller.update(rollouts.fraction.mean(), point)
        self.budget_sampler.update(point, task_loss.mean(), self.mean_over_ranks)
        with torch.no_grad():
            logits = self.tokenizer.decision_logits(tokens, budget)
            at_half = fraction_of([lg > 0 for lg in logits], tokens[-1].shape[1:3])
            deployed = self.calibrate(logits, point, budget, tokens[-1].shape[1:3])
        return {
            "loss": loss.detach(),
            "task_loss": task_loss.mean(),
            "reward": reward.mean(),
            "budget": torch.tensor(budget),
            "fraction": rollouts.fraction.mean(),
            "deployed_fraction": deployed.mean(),
            "fraction_p50": at_half.mean(),
            "lambda_point": torch.tensor(lam),
            "ppo_epochs": torch.tensor(float(epochs_run)),
            **ppo_stats,
        }
