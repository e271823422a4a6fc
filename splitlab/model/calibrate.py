"""Re-fit a trained model's operating points on a user's own images, without retraining.

The deployed cut of each budget is calibrated on the training images (`OperatingPoints`); on images
of another kind the same cut buys another fraction (measured: the demo model, budget 0.5, on 1,000
real photographs: mean 0.867). The policy's logits still rank the patches of those images; only
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

from splitlab.model.predict import InputImages, as_items, collate
from splitlab.tokenizer import entropy_scores, level_thresholds


@dataclass(frozen=True)
class Calibrated:
    """What `calibrate` did: on how many images, and the mean token fraction at ``budget`` before
    and after (the deployed path, the model's cap included)."""

    images: int
    budget: float
    before: float
    after: float
    skipped: int = 0


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
) -> Calibrated:
    """Set ``model``'s operating points from ``inputs`` (files, PIL images or tensors, read as
    `SplitModel.predict` reads them) and make ``budget`` (default: the model's) the one it deploys.

    A budget-conditioned policy gets every budget point re-fitted, so any budget of its range is met
    on such images; APT (``policy: entropy``) gets its per-level entropy cuts for ``budget`` (the
    same share of every level: no labels here to search the lowest loss with). The random policy
    meets its budget in expectation on any image: nothing to calibrate.

    Returns:
        a `Calibrated` record (mean fraction at ``budget`` before and after, on these images).
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
        InputImages(items, model.preprocessing, exif_transpose),
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
    fit_cuts(model, batches, budget)
    count = sum(len(images) for images in batches)
    return Calibrated(count, budget, before, mean_fraction(model, batches, budget), skipped)


@torch.inference_mode()
def fit_cuts(model: Any, batches: Sequence[Tensor], budget: float) -> None:
    """Re-fit ``model``'s cuts on preprocessed ``batches`` and deploy ``budget``: what `calibrate` does
    once the files are read (``bench`` calls it on its own batch, so it times the deployed path)."""
    if model.policy == "learned":
        points = model.tokenizer.operating_points
        budgets = points.calibration_budgets()
        logits: list[list[list[Tensor]]] = [[] for _ in budgets]
        for images in batches:
            tokens, _ = model.tokenizer.embed(images, model.backbone)
            for j, at in enumerate(budgets):
                logits[j].append(model.tokenizer.decision_logits(tokens, at))
        points.fit_sample([[torch.cat(level) for level in zip(*at, strict=True)] for at in logits])
    else:
        prep = model.preprocessing
        scores = [entropy_scores(images, model.levels, mean=prep.mean, std=prep.std) for images in batches]
        per_level = [torch.cat(level) for level in zip(*scores, strict=True)]
        model.apt_cuts.copy_(level_thresholds(per_level, budget))
        model.apt_fraction.fill_(budget)
    model.set_deployment(budget=budget)
