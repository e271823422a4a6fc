"""Re-fit a trained model's operating points on a user's own images, without retraining.

The deployed cut of each budget is calibrated on the training images (`OperatingPoints`); on images
of another kind the same cut buys another fraction (measured on the demo model, budget 0.5, over the
releases: 0.867 on real photographs once, 0.531 now; README). The policy's logits still rank the patches of those images; only
where to cut them is learned from the training distribution. `calibrate` recomputes the cuts on
the user's images: the logits are unchanged, only the cuts move (APT's per-level entropy cuts
likewise), so the model meets its budget on images like those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from splitlab.model.predict import InputImages, as_items, collate, mean_and_error
from splitlab.tokenizer import entropy_scores, level_thresholds

FOLDS = 5  # the held-out estimate: each image's fraction under cuts fitted on the other folds


@dataclass(frozen=True)
class Calibrated:
    """What `calibrate` did: on how many images, the mean token fraction at ``budget`` before and
    after (the deployed path, the model's cap included) on those images, and the fraction to expect
    on new images of the same kind: ``expected`` ± ``expected_error`` (standard error), each image
    measured under cuts fitted without it (``folds``-fold; None with fewer than two images)."""

    images: int
    budget: float
    before: float
    after: float
    skipped: int = 0
    expected: float | None = None
    expected_error: float | None = None
    folds: int = 0


def mean_fraction(model: Any, batches: Sequence[Tensor], budget: float) -> float:
    """The deployed layouts' mean token fraction on ``batches`` at ``budget``."""
    fractions = [model.layout(images, budget=budget).fraction for images in batches]
    return float(torch.cat(fractions).mean())


@torch.inference_mode()
def calibrate(
    model: Any,
    inputs: Any,
    budget: float | None = None,
    batch_size: int = 32,
    num_workers: int = 0,
    exif_transpose: bool | None = None,
    high_depth: str | None = None,
) -> Calibrated:
    """Set ``model``'s operating points from ``inputs`` (files, PIL images or tensors, read as
    `SplitModel.predict` reads them) and make ``budget`` (default: the model's) the one it deploys.

    A budget-conditioned policy gets every budget point re-fitted, so any budget of its range is met
    on such images; APT (``policy: entropy``) gets its per-level entropy cuts for ``budget`` (the
    same share of every level: no labels here to search the lowest loss with). The random policy
    meets its budget in expectation on any image: nothing to calibrate.

    A cut fitted on some images meets the budget on those exactly, and on new ones only as well as
    they resemble them: the fraction to expect on new images is measured before the final fit, by
    fitting on all folds but one and measuring the one left out (`FOLDS` folds, each image left out
    once), then the cuts are fitted on every image.

    Returns:
        a `Calibrated` record (mean fraction at ``budget`` before and after on these images, and
        the held-out estimate for new ones).
    """
    policy = model.policy
    if policy not in ("learned", "entropy"):
        raise ValueError(
            f"this model deploys policy={policy!r}, whose layouts do not depend on a calibrated cut: "
            "nothing to calibrate"
        )
    budget = model.budget if budget is None else float(budget)
    model.check_call(budget, None, None)
    items = as_items(inputs)
    loader = DataLoader(
        InputImages(items, model.preprocessing, exif_transpose, high_depth),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate,
    )
    device = next(model.parameters()).device
    batches, skipped = [], 0
    for _, images, _, unreadable in loader:
        skipped += len(unreadable)
        if images is not None:
            batches.append(images.to(device))
    if not batches:
        raise ValueError(f"none of the {len(items)} input(s) is a readable image: nothing to calibrate on")
    before = mean_fraction(model, batches, budget)
    sample = calibration_sample(model, batches, budget)
    count = sum(len(images) for images in batches)
    folds = min(FOLDS, count) if count >= 2 else 0
    expected, error = (
        mean_and_error(held_out_fractions(model, batches, sample, budget, folds)) if folds else (None, None)
    )
    fit_sample(model, sample, budget)
    model.calibration = (
        {
            "budget": budget,
            "images": count,
            "expected": expected,
            "error": error,
            "spread": error * count**0.5,
        }
        if folds
        else {}
    )
    return Calibrated(
        count, budget, before, mean_fraction(model, batches, budget), skipped, expected, error, folds
    )


def calibration_sample(model: Any, batches: Sequence[Tensor], budget: float) -> list[list[Tensor]]:
    """What the cuts are fitted on, per image (first dimension): of a learned policy, the decision
    logits per level at every calibration budget (``[budget][level]``); of APT, its per-level entropy
    scores (``[[level ...]]``)."""
    if model.policy == "learned":
        points = model.tokenizer.operating_points
        budgets = points.calibration_budgets()
        logits: list[list[list[Tensor]]] = [[] for _ in budgets]
        for images in batches:
            tokens, _ = model.tokenizer.embed(images, model.backbone)
            for j, at in enumerate(budgets):
                logits[j].append(model.tokenizer.decision_logits(tokens, at))
        return [[torch.cat(level) for level in zip(*at, strict=True)] for at in logits]
    prep = model.preprocessing
    scores = [entropy_scores(images, model.levels, mean=prep.mean, std=prep.std) for images in batches]
    return [[torch.cat(level) for level in zip(*scores, strict=True)]]


def fit_sample(
    model: Any, sample: Sequence[Sequence[Tensor]], budget: float, keep: Tensor | None = None
) -> None:
    """Fit ``model``'s cuts on a `calibration_sample` (only its images ``keep``, when given) and
    deploy ``budget``."""
    chosen = [[level if keep is None else level[keep] for level in at] for at in sample]
    finest = model.levels.finest_grid(model.backbone.img_size)  # the images are the model's size
    if model.policy == "learned":
        model.tokenizer.operating_points.fit_sample(chosen, finest=finest)
    else:
        model.apt_cuts.copy_(level_thresholds(chosen[0], budget, finest))
        model.apt_budget.fill_(budget)
    model.set_deployment(budget=budget)


def held_out_fractions(
    model: Any, batches: Sequence[Tensor], sample: Sequence[Sequence[Tensor]], budget: float, folds: int
) -> list[float]:
    """Each image's token fraction at ``budget`` under cuts fitted on the other ``folds - 1`` folds
    (images dealt to folds in a seeded random order); the model's cuts are as they were afterwards."""
    count = sum(len(images) for images in batches)
    fold_of = torch.empty(count, dtype=torch.long)
    fold_of[torch.randperm(count, generator=torch.Generator().manual_seed(0))] = torch.arange(count) % folds
    kept = {name: buffer.clone() for name, buffer in model.named_buffers()}
    deployed = model.budget
    fractions: list[float] = []
    try:
        for fold in range(folds):
            fit_sample(
                model, sample, budget, keep=(fold_of != fold).nonzero().squeeze(1).to(sample[0][0].device)
            )
            start = 0
            for images in batches:
                rows = (fold_of[start : start + len(images)] == fold).nonzero().squeeze(1)
                start += len(images)
                if len(rows):
                    layout = model.layout(images[rows.to(images.device)], budget=budget)
                    fractions += layout.fraction.tolist()
    finally:
        for name, buffer in model.named_buffers():
            buffer.copy_(kept[name])
        model.set_deployment(budget=deployed)
    return fractions


@torch.inference_mode()
def fit_cuts(model: Any, batches: Sequence[Tensor], budget: float) -> None:
    """Re-fit ``model``'s cuts on preprocessed ``batches`` and deploy ``budget``: what `calibrate` does
    once the files are read (``bench`` calls it on its own batch, so it times the deployed path)."""
    fit_sample(model, calibration_sample(model, batches, budget), budget)
