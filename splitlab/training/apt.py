"""APT trained in the pipeline: its fixed per-level entropy cuts, set from a calibration sample.

``apt_search: metric`` picks, along the budget constraint, the per-level cuts whose layouts give the
lowest task loss with the current backbone and head (`search_level_cuts`; at the start of the warm
start: the dense backbone it fine-tunes); ``quantile`` splits the same share of every level
(`level_thresholds`), which nothing says is where APT does best, kept to reproduce earlier numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from splitlab.tokenizer.baselines import layout_fraction, level_thresholds, search_level_cuts

Batches = Callable[[], Iterable[tuple[Tensor, Any]]]  # the sample's (images, targets), on the device, afresh


def fit_apt_cuts(training: Any, batches: Batches, entropies: list[list[Tensor]], search: str | None) -> str:
    """Set the model's APT cuts for its budget from the sample (``entropies``: each batch's per-level
    entropies) by ``search`` (``metric`` or ``quantile``; None: the cuts are APT's own thresholds, set
    already); what they are and the fraction they give the sample, in one line.

    ``training``: the `splitlab.training.SplitTraining` whose model and task loss the search reads."""
    model = training.model
    budget, levels = model.budget, model.levels
    per_level = [torch.cat(level) for level in zip(*entropies, strict=True)]
    finest = levels.finest_grid(model.backbone.img_size)
    how = "entropy_thresholds"
    if search is not None:
        if search == "quantile":
            cuts, how = level_thresholds(per_level, budget, finest), "same-quantile cuts"
        else:
            started = time.perf_counter()
            cuts, records = search_level_cuts(
                per_level,
                budget,
                lambda candidates: apt_losses(training, batches, entropies, candidates),
                finest=finest,
            )
            how = f"{describe_search(records)}, {time.perf_counter() - started:.1f} s"
        model.apt_cuts.copy_(training.reduce(cuts))
        model.apt_budget.fill_(budget)
    fraction = float(layout_fraction(per_level, model.apt_cuts, finest).mean())
    return (
        f"APT's cuts {[round(c, 3) for c in model.apt_cuts.tolist()]} bits for the {list(levels.sizes[:-1])} px "
        f"patches ({how}): token fraction {fraction:.3f} on {per_level[0].shape[0]} calibration images "
        f"(budget {budget:g})"
    )


def apt_losses(
    training: Any, batches: Batches, entropies: list[list[Tensor]], candidates: list[Tensor]
) -> Tensor:
    """Mean task loss of each candidate's APT layouts on the sample, one pass over it.

    Backbone and head run in eval mode; where the loss draws samples (detection's), every candidate
    gets the same draws, so the losses differ by the layouts alone. Averaged over ranks, so that every
    rank chooses the same cuts."""
    model, generator = training.model, training.generator
    device = model.apt_cuts.device
    totals = torch.zeros(len(candidates), dtype=torch.float64, device=device)
    seen = 0
    state = generator.get_state()
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        for (images, targets), levels in zip(batches(), entropies, strict=True):
            tokens, _ = model.tokenizer.embed(images, model.backbone)
            for i, cuts in enumerate(candidates):
                scores = [e - c for e, c in zip(levels, cuts.to(device), strict=True)]
                layout = model.tokenizer.tokenize(tokens, "scores", scores=scores, threshold=0.0)
                generator.set_state(state)
                outputs = training.task.forward_layout(layout)
                totals[i] += training.per_image_loss(outputs, targets).double().sum()
            seen += images.shape[0]
    finally:
        generator.set_state(state)
        for module, mode in modes.items():
            module.training = mode
    return training.reduce((totals / max(seen, 1)).float())


def describe_search(records: Sequence[dict[str, Any]]) -> str:
    """One line on a metric search: the chosen candidate's loss against the same-quantile cuts'."""
    if not records:
        return "one non-finest level: the budget alone fixes its cut"
    chosen = next(r for r in records if r["chosen"])
    quantile = records[0]
    met = sum(bool(r["met"]) for r in records)
    return (
        f"metric search, {len(records)} candidates ({met} meet the budget): loss {chosen['loss']:.4f} against "
        f"{quantile['loss']:.4f} of the same-quantile cuts {[round(c, 3) for c in quantile['cuts']]} "
        f"(fraction {quantile['fraction']:.3f})"
    )
