"""Where the deployed policy cuts to meet each budget, as plain functions: the checks at construction
(`check_budgets`, `check_apt`), whether APT still waits for its cuts (`apt_pending`) and the fixed
calibration sample (`calibration_sample`). The cuts themselves are the training object's
(`SplitTraining.fit_cuts`, `splitlab.training.apt`); `SplitTask.recalibrate` says when (docs/budgets.md).
A hard cap is `SplitModel`'s, applied as it lays out images."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset

from splitlab.data import SeededIndex
from splitlab.model import SplitModel
from splitlab.tasks.settings import EvaluationSettings, PolicyOptions
from splitlab.tokenizer import Levels
from splitlab.tokenizer.baselines import check_entropy_thresholds


def check_budgets(
    model: SplitModel,
    evaluation: EvaluationSettings,
    budget_range: Sequence[float] | None,
    max_fraction: float | None,
) -> None:
    """Refuse evaluation budgets the policy cannot serve, at construction: before any weights load
    or data is read (the model has checked the deployed budget and the cap)."""
    for budget in evaluation.eval_budgets:
        if budget_range is None and abs(budget - model.budget) > 1e-6:
            # worded from the settings: when budget overrides a checkpoint's, the
            # policy's own budget is not known here (on_load_checkpoint names it)
            raise ValueError(
                f"evaluation.eval_budgets={budget:g}: a policy trained for one budget (budget_range: "
                "null) is evaluated at its budget only; train a budget-conditioned policy "
                "(model.init_args.budget_range: [lowest, highest]) to serve others"
            )
        model.tokenizer.operating_points.check(budget, "eval_budgets")
        model.check_cap(max_fraction, budget, "eval_budgets")


def check_apt(policy: str, options: PolicyOptions, levels: Levels) -> None:
    """Refuse APT settings that cannot take effect, at construction (before data or weights load)."""
    if options.entropy_thresholds is None:
        return
    if policy != "entropy":
        raise ValueError(
            f"entropy_thresholds={list(options.entropy_thresholds)} fixes the cuts of APT trained in the pipeline, "
            f"but this run trains policy={policy!r}: set policy: entropy, or remove entropy_thresholds"
        )
    check_entropy_thresholds(options.entropy_thresholds, levels)


def apt_pending(policy: str, options: PolicyOptions, model: SplitModel, stage: str) -> bool:
    """Whether APT, the trained policy, still needs its cuts for the deployed budget.

    A metric search waits for the end of a dense stage run in the same fit: it ranks layouts by
    the loss of the backbone the warm start fine-tunes, which the dense stage is still training
    (`on_train_epoch_start` then runs it). APT's own thresholds and the same-quantile cuts read
    pixels only and are set at once.
    """
    if policy != "entropy" or model.apt_ready(model.budget):
        return False
    searched = options.entropy_thresholds is None and options.apt_search == "metric"
    return not (searched and stage == "dense")


def calibration_sample(loaders: Any, count: int, seed: int) -> Iterable[Any] | None:
    """The fixed calibration batches: ``count`` images of the training ``loaders`` (the same ones every
    time, with the training transforms, also after a resume), or None without a training DataLoader.
    Where the training data is several loaders (a multi-task run's, by name), an equal share of each,
    every batch a ``{name: batch}`` of one loader, as the combined loader's batches name them."""
    if isinstance(loaders, DataLoader):
        return _seeded_sample(loaders, count, seed)
    if not isinstance(loaders, dict) or not loaders:
        return None
    if not all(isinstance(loader, DataLoader) for loader in loaders.values()):
        return None
    share = max(count // len(loaders), 1)
    return NamedBatches({name: _seeded_sample(loader, share, seed) for name, loader in loaders.items()})


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
