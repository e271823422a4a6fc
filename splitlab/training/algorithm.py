"""`SplitTraining`: SPLIT's training as one plain-torch object that Lightning, Fabric and a plain loop
all drive.

It owns what the algorithm is: the stage (dense -> warm start -> PPO, `Progress`), the λ controller,
the budget each batch trains at, the warm start's labels and step, PPO's rollouts and update, and the
running calibration of the deployed cuts. What it is given: the `SplitModel`, the task's own code
(`TaskFunctions`: a task's `TaskLogic`), its settings (`TrainingSettings`) and, per step, a batch and
the loop's `Optimizers` (how that loop runs a backward and clips: Lightning's distributed ones, Fabric's,
or plain ``loss.backward()``). `splitlab.tasks.SplitTask` holds one and keeps Lightning's part.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from splitlab.model import SplitModel
from splitlab.model.base import DEPLOYS
from splitlab.rl import BudgetSampler, FractionController
from splitlab.tokenizer import (
    LabelEmbedding,
    TokenLayout,
    annotation_labels,
    calibrate_threshold,
    fraction_of,
    policy,
    warm_start_labels,
)
from splitlab.training.gains import finest_outputs, gain_split_labels, refinement_gains
from splitlab.training.optimizers import Optimizers, build_optimizers
from splitlab.training.progress import Progress, Stage
from splitlab.training.settings import TrainingSettings
from splitlab.training.steps import imitation_loss, policy_loss, roll_out
from splitlab.training.task import LossInputs, TaskFunctions

ANCHORED_SOURCES = ("annotations", "loss", "fidelity")  # labels PPO stays anchored to by default


def trained_parts(model: SplitModel) -> list[nn.Module]:
    """What the task optimizer trains and frozen stages freeze by default: backbone, embeddings, head."""
    return [model.backbone, model.tokenizer.embed, *([model.head] if model.head is not None else [])]


class SplitTraining:
    """SPLIT's training of one model: which stage runs and one step of each.

    Args:
        model: the model trained (its tokenizer, backbone, head and operating points).
        task: the task's own code (`TaskFunctions`).
        settings: what the algorithm reads (`TrainingSettings`).
        reduce: a tensor's mean over ranks (what every rank must agree on: λ, the cuts, the budget
            draws' loss averages); the identity on one process.
        generator: the policy's sampling generator (Lightning's task gives each rank its own stream,
            checkpointed); None: one seeded with ``settings.sampling_seed`` on the model's device.
        task_modules: what the task optimizer trains and frozen stages freeze; None: backbone,
            embeddings and head (a VQA task keeps its frozen language model out).
    """

    def __init__(
        self,
        model: SplitModel,
        task: TaskFunctions,
        settings: TrainingSettings | None = None,
        reduce: Callable[[Tensor], Tensor] | None = None,
        generator: Callable[[], torch.Generator] | None = None,
        task_modules: Sequence[nn.Module] | None = None,
    ) -> None:
        self.model, self.task = model, task
        self.settings = settings if settings is not None else TrainingSettings()
        self.reduce = reduce if reduce is not None else (lambda value: value)
        self._generator = generator
        self._own_generator: torch.Generator | None = None
        self._task_modules = list(task_modules if task_modules is not None else trained_parts(model))
        self.progress = Progress()  # the stage and the PPO updates run: one writer each
        points = model.tokenizer.operating_points.budgets.tolist()
        c = self.settings.controller
        self.controller = FractionController(  # λ per budget point
            points, c.lr, c.gain, c.damping, init=c.init, reduce=self.reduce
        )
        self.budget_sampler = BudgetSampler(len(points))
        self.label_embedding = LabelEmbedding(model.backbone.model.patch_embed)  # the labels' target

    # ----------------------------------------------------------------------------- state
    def state_modules(self) -> dict[str, nn.Module]:
        """What a checkpoint keeps of the algorithm besides the model (a Lightning task registers them
        under these names; a plain loop saves their state dicts and moves them with the model)."""
        return {
            "controller": self.controller,
            "budget_sampler": self.budget_sampler,
            "label_embedding": self.label_embedding,
        }

    @property
    def generator(self) -> torch.Generator:
        if self._generator is not None:
            return self._generator()
        device = self.model.tokenizer.operating_points.budgets.device
        if self._own_generator is None or self._own_generator.device != device:
            self._own_generator = torch.Generator(device).manual_seed(int(self.settings.sampling_seed))
        return self._own_generator

    @property
    def stage(self) -> Stage:
        return self.progress.stage

    @property
    def deployed_policy(self) -> str:
        """What inference uses: the trained policy, or the uniform grid while only dense training ran."""
        name = self.settings.policy
        return "uniform" if self.stage == "dense" else DEPLOYS.get(name, name)

    def sync_deployed(self) -> None:
        """Tell the model which policy it deploys (and so which one its hard cap binds)."""
        self.model.policy = self.deployed_policy

    def task_modules(self) -> list[nn.Module]:
        """What the task optimizer trains and frozen stages freeze (``task_modules``)."""
        return list(self._task_modules)

    def enter(self, stage: Stage, training: bool = True) -> None:
        """Enter a stage: PPO freezes backbone, head and embeddings (and puts them in eval mode)."""
        self.progress.enter(stage)
        self.sync_deployed()
        trainable = not self.task_frozen
        for module in self.task_modules():
            module.requires_grad_(trainable)
            module.train(trainable and training)

    @property
    def policy_trains(self) -> bool:
        """Whether this stage updates the decision module (`Progress.policy_trains`)."""
        return self.progress.policy_trains(self.settings.policy, self.settings.transfer_finetune)

    @property
    def task_frozen(self) -> bool:
        """Whether this stage leaves backbone, head and embeddings as they are (`Progress.task_frozen`)."""
        return self.progress.task_frozen(self.settings.warm_start.finetune)

    # ----------------------------------------------------------------------------- optimizers
    def optimizers(self, supervised_steps: int, ppo_steps: int = 1) -> Optimizers:
        """The task's and the policy's optimizers, the task's schedule over the ``supervised_steps`` of
        the dense and warm-start stages, and the ``ppo_steps`` the policy's learning rate anneals over
        (`build_optimizers`)."""
        return build_optimizers(
            self.model, self.task_modules(), self.settings.optim, supervised_steps, ppo_steps
        )

    def policy_lr(self, ppo_steps: int) -> float:
        """The decision module's learning rate in this stage: ``imitation_lr`` outside PPO; in PPO
        ``policy_lr`` annealed (cosine to 5%) over the ``ppo_steps`` planned.

        Late in PPO the policy should settle where λ holds it: a fast-moving policy at the end leaves
        the deployed fraction wherever the last oscillation put it. The count is the controller's
        (checkpointed), so the schedule survives a resume."""
        if self.stage != "ppo":
            return self.settings.warm_start.imitation_lr
        progress = min(self.controller.total_steps / max(ppo_steps, 1), 1.0)
        return self.settings.optim.policy_lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))

    # ----------------------------------------------------------------------------- the task's loss
    def per_image_loss(self, outputs: Any, targets: Any, generator: torch.Generator | None = None) -> Tensor:
        """The task loss of each image, ``(B,)`` (``generator``: the random source of a loss that
        samples, default the run's); PPO's is taken on the reference proposals."""
        inputs = LossInputs(self.generator if generator is None else generator, self.stage == "ppo")
        return self.task.per_image_loss(outputs, targets, inputs)

    def loss_gains(
        self, images: Tensor, targets: Any, generator: Any = None, tokens: Any = None, own: bool = False
    ) -> list[Tensor]:
        """How much each split lowers this batch's task loss (`refinement_gains`): ``loss`` labels,
        ``loss_oracle``; with ``own``, the loss to the model's own prediction on the finest grid
        (``fidelity`` labels; that prediction without gradient: `finest_outputs`)."""
        if own:
            targets = self.task.own_targets(finest_outputs(self.model, images, tokens), targets)
        loss = partial(self.per_image_loss, targets=targets, generator=generator)
        return refinement_gains(self.model, images, loss, self.settings.warm_start.loss_steps, tokens)

    # ----------------------------------------------------------------------------- budgets
    def step_budget(self, step: int) -> tuple[int, float]:
        """This step's training budget: the one target, or (budget-conditioned) a point drawn per batch,
        more often where it costs more task loss than the cheapest point (`BudgetSampler`).

        The draw is a function of ``(sampling_seed, step)`` and of reduced loss averages: the same on
        every rank (λ and the operating points are kept per point and must agree) and after a resume.
        """
        points = self.controller.budgets
        if len(points) == 1:
            return 0, points[0]
        point = self.budget_sampler.draw(int(self.settings.sampling_seed) * 1_000_003 + int(step))
        return point, points[point]

    def calibrate(self, logits: Sequence[Tensor], point: int, budget: float, finest: Sequence[int]) -> Tensor:
        """Move the operating point of ``budget`` towards this batch's exact cut; the deployed fractions
        (of the ``finest`` grid)."""
        logits = [lg.detach() for lg in logits]
        operating_points = self.model.tokenizer.operating_points
        operating_points.update(point, calibrate_threshold(logits, budget, finest=finest), self.reduce)
        cut = operating_points.cuts[point]
        return fraction_of([lg > cut for lg in logits], finest)

    @torch.no_grad()
    def fit_cuts(self, images: Iterable[Tensor]) -> None:
        """Set every operating point from a fixed sample (batches of ``images``) under the policy as it
        is: its logits at the points and the budgets between them, through embedding and decision
        module only; the cuts averaged over ranks. The running average of `calibrate` lags when PPO
        moves the logits quickly; a loop calls this before it evaluates or saves (the Lightning task
        before each validation of a fit: `splitlab.tasks.hooks.TaskHooks.recalibrate`)."""
        tokenizer = self.model.tokenizer
        points = tokenizer.operating_points
        budgets = points.calibration_budgets()  # the points, and budgets between them
        logits: list[list[list[Tensor]]] = [[] for _ in budgets]
        finest = None
        for batch in images:
            finest = self.model.levels.finest_grid(batch.shape[-2:])
            tokens, _ = tokenizer.embed(batch, self.model.backbone)
            for j, budget in enumerate(budgets):
                logits[j].append(tokenizer.decision_logits(tokens, budget))
        if finest is None:
            return
        # the cuts, and the spreads: any cap meets the budgets too
        points.fit_sample(
            [[torch.cat(level) for level in zip(*at, strict=True)] for at in logits], self.reduce, finest
        )

    # ----------------------------------------------------------------------------- labels
    def anchor_weight(self) -> float:
        """PPO's weight on the warm start's imitation loss (``ppo.imitation``); by default 1.0 where the
        labels read the task (``annotations``, ``loss``, ``fidelity``) and 0 where they are a proxy:
        anchored to embedding-difference labels the classification twin without annotations kept
        0.878-0.885 top-1 at half the tokens, unanchored 0.983-0.997 (docs/oracle.md); anchored to
        fidelity labels (raw gains) hard ADE20K seed 0 kept 0.477 mIoU at 0.3, 0.463 unanchored
        (docs/loss_labels.md)."""
        if self.settings.ppo.imitation is not None:
            return float(self.settings.ppo.imitation)
        return 1.0 if self.settings.warm_start.label_source in ANCHORED_SOURCES else 0.0

    def imitation_labels(
        self, images: Tensor, batch: Any, budget: float, tokens: list[Tensor] | None = None
    ) -> list[Tensor]:
        """The warm start's split labels at ``budget`` (``label_source``): from embedding differences
        (the paper's), the oracle's layout from the batch's annotations, the splits worth most to the
        task loss of the model as it is now (``loss``) or that keep its outputs closest to its own on
        the finest grid (``fidelity``), or APT's layout (``entropy``); ``tokens``: the batch's
        embeddings, if at hand."""
        source, levels = self.settings.warm_start.label_source, self.model.levels
        if source in ("loss", "fidelity"):
            _, targets = self.task.unpack_batch(batch)
            gains = self.loss_gains(images, targets, tokens=tokens, own=source == "fidelity")
            return gain_split_labels(gains, levels, budget, levels.finest_grid(images.shape[-2:]))
        if source == "entropy":  # APT's layout at the budget: pixel entropy, no annotations, no model
            scores, cut = self.model.scores("entropy", images, budget, self.generator)
            return [level > cut for level in scores]
        if source not in ("annotations", "embedding"):  # never a silent fallback to another source
            raise ValueError(f"warm_start.label_source={source!r}: no labels of that kind")
        if source == "annotations":
            cells = self.task.annotated_cells(batch, levels.grid(levels.num - 1, tuple(images.shape[-2:])))
            if cells is None:
                raise ValueError(
                    f"label_source=annotations: this batch gives no annotations ({type(self.task).__name__})"
                )
            return annotation_labels(cells.to(images.device), levels, budget, self.generator)[0]
        return warm_start_labels(self.label_content(images), levels, budget)[0]

    def label_content(self, images: Tensor) -> list[Tensor]:
        """The patch-content embeddings the imitation labels read (``label_target``): a frozen copy of
        the patch embedding, taken at the warm start's first step, or the live one."""
        embed, backbone = self.model.tokenizer.embed, self.model.backbone
        if self.settings.warm_start.label_target == "live":
            return embed.content(images, backbone)
        if not self.label_embedding.ready:
            self.label_embedding.take(backbone.model.patch_embed)
        return embed.content(images, self.label_embedding)

    def warm_start_layout(
        self, tokens: list[Tensor], logits: list[Tensor], labels: list[Tensor]
    ) -> TokenLayout:
        """The layouts the backbone fine-tunes on in the warm start: per image, the imitation labels
        (with probability ``teacher_forcing``) or a sample of the policy.

        Samples are what PPO's rollouts and deployment will show the frozen backbone, and their
        variety keeps it robust to PPO's exploration; label layouts keep the objects at fine
        resolution while the policy is still random, which a backbone fine-tuned on random layouts
        alone loses. What each share costs, and the variants tried: docs/comparison.md and
        docs/budgets.md.
        """
        tokenizer, share = self.model.tokenizer, float(self.settings.warm_start.teacher_forcing)
        if share <= 0:
            return tokenizer.tokenize(tokens, "sample", logits=logits, generator=self.generator)
        sampled = policy.sample(logits, self.generator)
        batch, device = tokens[0].shape[0], tokens[0].device
        teacher = torch.rand(batch, generator=self.generator, device=device) < share
        mixed = [
            torch.where(teacher.view(-1, 1, 1), lab, smp) for lab, smp in zip(labels, sampled, strict=True)
        ]
        return tokenizer.tokenize(tokens, "labels", labels=mixed, logits=logits)

    # ----------------------------------------------------------------------------- the steps
    def training_step(
        self, images: Tensor, targets: Any, batch: Any, opt: Optimizers
    ) -> dict[str, Tensor] | None:
        """One training step of the stage on a batch (``images`` and ``targets`` as the task unpacks
        ``batch``, which annotation labels read) with the loop's optimizers; its statistics, or None
        where nothing learns (a fixed policy with the task frozen)."""
        if self.task_frozen and not self.policy_trains:
            return None
        for group in opt.policy.param_groups:
            group["lr"] = self.policy_lr(opt.ppo_steps)
        if self.stage == "ppo":
            return self.ppo_step(images, targets, batch, opt)
        return self.supervised_step(images, targets, batch, opt)

    def _layout_of(self, images: Tensor, tokens: list[Tensor], step: int) -> tuple[Any, dict[str, Tensor]]:
        """The layout a dense, transferred or fixed policy's supervised step trains on (or None: the
        learned policy's, which `supervised_step` builds with its labels)."""
        tokenizer, name, stats = self.model.tokenizer, self.settings.policy, {}
        if self.stage == "dense":
            uniform = [t.new_ones(t.shape[:3]) for t in tokens[:-1]]
            return tokenizer.tokenize(tokens, "scores", scores=uniform, threshold=0.0), stats
        if name == "transferred":  # fine-tuned on the frozen policy's deployed layouts
            point, budget = self.step_budget(step)
            with torch.no_grad():
                logits = tokenizer.decision_logits(tokens, budget)
            stats["deployed_fraction"] = self.calibrate(logits, point, budget, tokens[-1].shape[1:3]).mean()
            return tokenizer.tokenize(tokens, "threshold", logits=logits, budget=budget), stats
        if name != "learned":  # APT and random, fine-tuned on their own layouts
            scores, cut = self.model.scores(name, images, self.model.budget, self.generator)
            return tokenizer.tokenize(tokens, "scores", scores=scores, threshold=cut), stats
        return None, stats

    def supervised_step(self, images: Tensor, targets: Any, batch: Any, opt: Optimizers) -> dict[str, Tensor]:
        """Dense or warm-start step: task loss on layouts (+ imitation BCE in the warm start)."""
        tokenizer, warm = self.model.tokenizer, self.settings.warm_start
        tokens, _ = tokenizer.embed(images, self.model.backbone)
        layout, stats = self._layout_of(images, tokens, opt.steps)
        imitation = None
        if layout is None:
            point, budget = self.step_budget(opt.steps)
            logits = tokenizer.decision_logits(tokens, budget)
            labels = self.imitation_labels(images, batch, budget, tokens)
            imitation = imitation_loss(logits, labels)
            # The backbone fine-tunes on a mix of label layouts and policy samples (see there why).
            layout = self.warm_start_layout(tokens, logits, labels)
            stats["deployed_fraction"] = self.calibrate(logits, point, budget, tokens[-1].shape[1:3]).mean()
            stats["label_agreement"] = torch.stack(
                [((lg > 0) == lab).float().mean() for lg, lab in zip(logits, labels, strict=True)]
            ).mean()
        frozen = self.task_frozen  # a warm start that trains the decision module alone
        with torch.no_grad() if frozen else contextlib.nullcontext():  # the task loss is then a statistic
            task_loss = self.per_image_loss(self.task.forward_layout(layout), targets).mean()
        if frozen:
            loss = warm.imitation_weight * imitation
        else:
            loss = task_loss if imitation is None else task_loss + warm.imitation_weight * imitation
        opt.task.zero_grad()
        opt.policy.zero_grad()
        opt.backward(loss, [opt.policy] if frozen else [opt.task, opt.policy])
        if not frozen:
            opt.clip(opt.task, self.settings.optim.grad_clip)
            self._step(opt, opt.task)
            if opt.task_schedule is not None:
                opt.task_schedule.step()
        if imitation is not None:
            self._step(opt, opt.policy)
            for _ in range(warm.imitation_steps - 1):  # the decision module alone, on the same batch
                imitation = imitation_loss(
                    tokenizer.decision_logits([t.detach() for t in tokens], budget), labels
                )
                opt.policy.zero_grad()
                opt.backward(warm.imitation_weight * imitation, [opt.policy])
                self._step(opt, opt.policy)
            stats["imitation"] = imitation.detach()
            self.budget_sampler.update(point, task_loss.detach(), self.reduce)
        stats.update(loss=loss.detach(), task_loss=task_loss.detach(), fraction=layout.fraction.mean())
        return stats

    @staticmethod
    def _step(opt: Optimizers, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()
        opt.steps += 1

    def kl_stop(self, epoch: int, approx_kl: Tensor) -> bool:
        """Whether PPO's ``target_kl`` ends the batch's policy epochs (the same decision on every rank)."""
        target = self.settings.ppo.target_kl
        return target is not None and epoch > 0 and float(self.reduce(approx_kl)) > 1.5 * target

    def ppo_step(self, images: Tensor, targets: Any, batch: Any, opt: Optimizers) -> dict[str, Tensor]:
        """Roll out sampled layouts, score them with the frozen model, update the policy K times."""
        cfg, task = self.settings.ppo, self.task
        point, budget = self.step_budget(opt.steps)
        lam = float(self.controller.values[point])

        def score(layouts: TokenLayout) -> Tensor:
            return self.per_image_loss(
                task.forward_layout(layouts), task.repeat_targets(targets, cfg.samples)
            )

        rolled = roll_out(self.model, images, budget, lam, cfg.samples, score, self.generator, self.reduce)
        anchor = self.anchor_weight()
        labels = self.imitation_labels(images, batch, budget, rolled.tokens) if anchor > 0 else None
        epochs_run = 0
        for epoch in range(cfg.epochs):
            loss, ppo_stats, logits = policy_loss(self.model, rolled, budget, cfg)
            if labels is not None:  # the warm start's labels as an anchor
                imitation = imitation_loss(logits, labels)
                ppo_stats["imitation"] = imitation.detach()
                loss = loss + anchor * imitation
            if self.kl_stop(epoch, ppo_stats["approx_kl"]):
                break
            opt.policy.zero_grad()
            opt.backward(loss, [opt.policy])
            opt.clip(opt.policy, cfg.max_grad_norm)
            self._step(opt, opt.policy)
            epochs_run += 1
        self.progress.count_ppo_step()
        self.controller.update(rolled.layouts.fraction.mean(), point)
        self.budget_sampler.update(point, rolled.task_loss.mean(), self.reduce)
        with torch.no_grad():
            finest = rolled.tokens[-1].shape[1:3]
            logits = self.model.tokenizer.decision_logits(rolled.tokens, budget)
            at_half = fraction_of([lg > 0 for lg in logits], finest)
            deployed = self.calibrate(logits, point, budget, finest)
        return {
            "loss": loss.detach(),
            "task_loss": rolled.task_loss.mean(),
            "reward": rolled.reward.mean(),
            "budget": torch.tensor(budget),
            "fraction": rolled.layouts.fraction.mean(),
            "deployed_fraction": deployed.mean(),
            "fraction_p50": at_half.mean(),
            "lambda_point": torch.tensor(lam),
            "ppo_epochs": torch.tensor(float(epochs_run)),
            **ppo_stats,
        }
