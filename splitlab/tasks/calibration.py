"""Where the deployed policy cuts to meet each budget: the learned policy's operating points set
from a fixed calibration sample, and the fixed entropy cuts of APT trained in the pipeline
(docs/budgets.md). A hard cap is `SplitModel`'s, applied as it lays out images."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Subset

from splitlab.data import SeededIndex
from splitlab.lightning_private import attached_trainer
from splitlab.tokenizer import entropy_scores
from splitlab.tokenizer.baselines import check_entropy_thresholds, cuts_from_thresholds
from splitlab.training.apt import fit_apt_cuts


class Calibration:
    """Sets the deployed cuts of a `SplitTask` (`recalibrate`) and checks, at construction, the budgets
    and APT settings they must serve.

    Uses of its task only what `SplitTask` defines (model parts, ``stage``, ``deployed_policy``,
    the task API, ``mean_over_ranks``) and Lightning's; `SplitTask` says when it runs.
    """

    def check_budgets(self) -> None:
        """Refuse evaluation budgets the policy cannot serve, at construction: before any weights load
        or data is read (the model has checked the deployed budget and the cap)."""
        hp = self.hparams
        for budget in hp.evaluation.eval_budgets:
            if hp.budget_range is None and abs(budget - self.budget) > 1e-6:
                # worded from the settings: when budget overrides a checkpoint's, the
                # policy's own budget is not known here (on_load_checkpoint names it)
                raise ValueError(
                    f"evaluation.eval_budgets={budget:g}: a policy trained for one budget (budget_range: "
                    "null) is evaluated at its budget only; train a budget-conditioned policy "
                    "(model.init_args.budget_range: [lowest, highest]) to serve others"
                )
            self.tokenizer.operating_points.check(budget, "eval_budgets")
            self.model.check_cap(hp.max_fraction, budget, "eval_budgets")

    @torch.no_grad()
    def recalibrate(self) -> None:
        """Set every operating point from a fixed sample of training images under the current policy.

        The running average of `calibrate` lags when PPO moves the logits quickly (measured on
        the COCO twin: deployed 0.44 for a budget of 0.50); before each validation of a fit the
        cuts are therefore recomputed exactly, as "precise BatchNorm" recomputes statistics:
        ``calibration_images`` training images (the same ones every time, with the training
        transforms) through embedding and decision module only, no backbone
        (`SplitTraining.fit_cuts`). The global RNG is
        forked, so training randomness is unchanged; under DDP the cuts are averaged over ranks.
        With ``policy: entropy`` APT's fixed per-level entropy cuts are set once (`set_apt_cuts`; its
        metric search runs backbone and head on the sample too).
        """
        count = int(self.hparams.evaluation.calibration_images)
        learned = self.deployed_policy == "learned"
        apt = self.apt_pending()
        thresholds = self.hparams.policy_options.entropy_thresholds
        if apt and thresholds is not None:  # APT's own thresholds: no calibration
            self.model.apt_cuts.copy_(cuts_from_thresholds(thresholds, self.levels))
            self.model.apt_budget.fill_(self.budget)
        sample = self.calibration_sample(count) if count > 0 and (learned or apt) else None
        if sample is None:
            return
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), self.trainer.precision_plugin.forward_context():
            # (made in here: a loader's iterator draws its base seed from the global RNG)
            images = (self.unpack_batch(self.transfer_batch_to_device(b, self.device, 0))[0] for b in sample)
            if apt:
                mean, std = self.model.preprocessing.mean, self.model.preprocessing.std
                self.set_apt_cuts(
                    sample, [entropy_scores(x, self.levels, mean=mean, std=std) for x in images]
                )
            elif learned:  # the training object's cuts, from the sample's logits
                self.algorithm.fit_cuts(images)

    def calibration_sample(self, count: int) -> Iterable[Any] | None:
        """The fixed calibration batches: ``count`` training images (the same ones every time, with the
        training transforms, also after a resume), or None without a training DataLoader. Where the
        training data is several loaders (a multi-task run's, by name), an equal share of each, every
        batch a ``{name: batch}`` of one loader, as the combined loader's batches name them."""
        loaders = self.trainer.train_dataloader if attached_trainer(self) is not None else None
        if isinstance(loaders, DataLoader):
            return _seeded_sample(loaders, count, int(self.hparams.policy_options.sampling_seed))
        if not isinstance(loaders, dict) or not loaders:
            return None
        if not all(isinstance(loader, DataLoader) for loader in loaders.values()):
            return None
        share = max(count // len(loaders), 1)
        seed = int(self.hparams.policy_options.sampling_seed)
        return NamedBatches({name: _seeded_sample(loader, share, seed) for name, loader in loaders.items()})

    # ----------------------------------------------------------------------------- APT trained in the pipeline
    def check_apt(self) -> None:
        """Refuse APT settings that cannot take effect, at construction (before data or weights load)."""
        hp = self.hparams
        if hp.policy_options.entropy_thresholds is None:
            return
        if hp.policy != "entropy":
            raise ValueError(
                f"entropy_thresholds={list(hp.policy_options.entropy_thresholds)} fixes the cuts of APT trained in the pipeline, "
                f"but this run trains policy={hp.policy!r}: set policy: entropy, or remove entropy_thresholds"
            )
        check_entropy_thresholds(hp.policy_options.entropy_thresholds, self.levels)

    def apt_pending(self) -> bool:
        """Whether APT, the trained policy, still needs its cuts for the deployed budget.

        A metric search waits for the end of a dense stage run in the same fit: it ranks layouts by
        the loss of the backbone the warm start fine-tunes, which the dense stage is still training
        (`on_train_epoch_start` then runs it). APT's own thresholds and the same-quantile cuts read
        pixels only and are set at once.
        """
        hp = self.hparams
        if hp.policy != "entropy" or self.model.apt_ready(self.budget):
            return False
        searched = hp.policy_options.entropy_thresholds is None and hp.policy_options.apt_search == "metric"
        return not (searched and self.stage == "dense")

    def set_apt_cuts(self, sample: DataLoader, entropies: list[list[Tensor]]) -> None:
        """Set APT's fixed per-level cuts from the calibration sample (`splitlab.training.apt`: by the
        task loss, ``apt_search: metric``, or the same quantile of every level) and say what they are."""
        options = self.hparams.policy_options

        def batches() -> Iterator[tuple[Tensor, Any]]:
            for batch in sample:
                yield self.unpack_batch(self.transfer_batch_to_device(batch, self.device, 0))

        search = options.apt_search if options.entropy_thresholds is None else None
        rank_zero_info(f"splitlab: {fit_apt_cuts(self.algorithm, batches, entropies, search)}")


def _seeded_sample(loader: DataLoader, count: int, seed: int) -> DataLoader:
    """``count`` images of ``loader``'s dataset, chosen and augmented by ``seed`` alone."""
    dataset = loader.dataset
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    chosen = order[: min(count, len(dataset))].tolist()
    return DataLoader(
        Subset(dataset, [SeededIndex(i, seed * 1_000_003 + i) for i in chosen]),
        batch_size=loader.batch_size or 1,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
    )


class NamedBatches:
    """Each loader's batches in turn, each as ``{name: batch}`` (re-iterable, as a DataLoader is)."""

    def __init__(self, loaders: dict[str, DataLoader]) -> None:
        self.loaders = loaders

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for name, loader in self.loaders.items():
            for batch in loader:
                yield {name: batch}
