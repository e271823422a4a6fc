"""How a `SplitTask` trains for its budgets: which budget a batch trains at, and where the deployed
policy cuts to meet each one (see docs/budgets.md)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Subset

from splitlab.data import SeededIndex
from splitlab.tokenizer import calibrate_threshold, entropy_scores, fraction_of, level_thresholds


class BudgetTraining:
    """Budget half of the training mixin: the batch's budget point and the operating points' calibration."""

    def check_budgets(self) -> None:
        """Refuse evaluation budgets the policy cannot serve, at construction: before any weights load
        or data is read (the model has checked the deployed budget and the cap)."""
        hp = self.hparams
        for budget in hp.eval_budgets:
            if hp.budgets is None and abs(budget - self.target_fraction) > 1e-6:
                # worded from the settings: when target_fraction overrides a checkpoint's, the
                # policy's own budget is not known here (on_load_checkpoint names it)
                raise ValueError(
                    f"eval_budgets={budget:g}: a policy trained for one budget (budgets: null) is "
                    "evaluated at its target_fraction only; train a budget-conditioned policy "
                    "(model.init_args.budgets: [lowest, highest]) to serve others"
                )
            self.tokenizer.operating_points.check(budget, "eval_budgets")
            if hp.max_fraction is not None and budget > hp.max_fraction + 1e-9:
                raise ValueError(
                    f"eval_budgets={budget:g} is above max_fraction={hp.max_fraction:g}: the cap holds every image "
                    "below that budget, so it cannot be met; evaluate budgets up to max_fraction"
                )

    def step_budget(self) -> tuple[int, float]:
        """This step's training budget: the one target, or (budget-conditioned) a point drawn per batch,
        more often where it costs more task loss than the cheapest point (`BudgetSampler`).

        The draw is a function of ``(sampling_seed, global_step)`` and of reduced loss averages:
        the same on every rank (λ and the operating points are kept per point and must agree)
        and the same after a resume.
        """
        points = self.controller.targets
        if len(points) == 1:
            return 0, points[0]
        point = self.budget_sampler.draw(int(self.hparams.sampling_seed) * 1_000_003 + int(self.global_step))
        return point, points[point]

    def calibrate(self, logits: Sequence[Tensor], point: int, budget: float) -> Tensor:
        """Move the operating point of ``budget`` towards this batch's exact cut; the deployed fractions."""
        logits = [lg.detach() for lg in logits]
        self.tokenizer.operating_points.update(
            point, calibrate_threshold(logits, budget), self._mean_over_ranks
        )
        cut = self.tokenizer.operating_points.cuts[point]
        return fraction_of([lg > cut for lg in logits])

    @torch.no_grad()
    def recalibrate(self) -> None:
        """Set every operating point from a fixed sample of training images under the current policy.

        The running average of `calibrate` lags when PPO moves the logits quickly (measured on
        the COCO twin: deployed 0.44 for a budget of 0.50); before each validation of a fit the
        cuts are therefore recomputed exactly, as "precise BatchNorm" recomputes statistics:
        ``calibration_images`` training images (the same ones every time, with the training
        transforms) through embedding and decision module only, no backbone. The global RNG is
        forked, so training randomness is unchanged; under DDP the cuts are averaged over ranks.
        With ``policy: entropy`` the same sample sets APT's fixed per-level entropy cuts
        (`level_thresholds`), once: they read pixels only.
        """
        count = int(self.hparams.calibration_images)
        loader = self.trainer.train_dataloader if self._trainer is not None else None
        learned = self.deployed_policy == "learned"
        # APT's cuts read pixels only: set once per budget (also before a dense stage ends)
        apt = self.hparams.policy == "entropy" and not self.model.apt_ready(self.target_fraction)
        if count <= 0 or not (learned or apt) or not isinstance(loader, DataLoader):
            return
        dataset = loader.dataset
        order = torch.randperm(
            len(dataset), generator=torch.Generator().manual_seed(self.hparams.sampling_seed)
        )
        chosen = order[: min(count, len(dataset))].tolist()
        sample = DataLoader(  # the same images with the same augmentation every time, also after a resume
            Subset(dataset, [SeededIndex(i, self.hparams.sampling_seed * 1_000_003 + i) for i in chosen]),
            batch_size=loader.batch_size or 1,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
        )
        points = self.tokenizer.operating_points
        logits: list[list[list[Tensor]]] = [[] for _ in range(len(points.budgets))]
        entropies: list[list[Tensor]] = []
        mean, std = self.normalisation
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), self.trainer.precision_plugin.forward_context():
            for batch in sample:
                images, _ = self.split_batch(self.transfer_batch_to_device(batch, self.device, 0))
                if apt:
                    entropies.append(entropy_scores(images, self.levels, mean=mean, std=std))
                if not learned:
                    continue
                tokens, _ = self.tokenizer.embed(images, self.backbone)
                for point, budget in enumerate(points.budgets.tolist()):
                    logits[point].append(self.tokenizer.decision_logits(tokens, budget))
        if apt:
            per_level = [torch.cat(level) for level in zip(*entropies, strict=True)]
            self.model.apt_cuts.copy_(
                self._mean_over_ranks(level_thresholds(per_level, self.target_fraction))
            )
            self.model.apt_fraction.fill_(self.target_fraction)
        if not learned:
            return
        for point, budget in enumerate(points.budgets.tolist()):
            per_level = [torch.cat(level) for level in zip(*logits[point], strict=True)]
            points.set(point, calibrate_threshold(per_level, budget), self._mean_over_ranks)
