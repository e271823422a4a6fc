"""Metrics splitlab adds to torchmetrics: where the fine tokens go, and per-policy statistics.

`FineCoverage` measures allocation (the paper's object / boundary coverage); `PolicyStats` wraps a
task's metrics with the token fraction and throughput of one layout policy, as the comparison
table reports them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric, Metric, MetricCollection, SumMetric

from splitlab.tokenizer import TokenLayout


def cell_classes(
    masks: Tensor, cell: int, ignore_index: int, background: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """Per finest cell: does it hold an object pixel, and is it on a class boundary (>= 2 classes)?

    Args:
        masks: ``(B, H, W)`` class indices.
        cell: finest patch size in pixels.
        ignore_index: label of unlabelled pixels (not a class).
        background: classes that are not objects (e.g. stuff).

    Returns:
        ``(B, H/cell, W/cell)`` bool ``object`` and ``boundary`` maps.
    """
    b, h, w = masks.shape
    cells = (
        masks.reshape(b, h // cell, cell, w // cell, cell)
        .permute(0, 1, 3, 2, 4)
        .reshape(b, h // cell, w // cell, -1)
    )
    valid = cells != ignore_index
    is_object = valid.clone()
    for cls in background:
        is_object &= cells != cls
    big = torch.iinfo(torch.int64).max
    lo = torch.where(valid, cells.long(), big).amin(-1)
    hi = torch.where(valid, cells.long(), -1).amax(-1)
    return is_object.any(-1), valid.any(-1) & (lo != hi)


def instance_label_map(
    boxes: Tensor, labels: Tensor, size: tuple[int, int], masks: Tensor | None = None
) -> Tensor:
    """``(H, W)`` map of one image's instances for `FineCoverage`: 0 background, each instance its
    label (its mask where given, else its box), later instances over earlier ones."""
    out = torch.zeros(size, dtype=torch.long, device=boxes.device)
    for i, (box, label) in enumerate(zip(boxes.round().long().tolist(), labels.tolist(), strict=True)):
        if masks is not None:
            out[masks[i].bool()[: size[0], : size[1]]] = int(label)
        else:
            x0, y0, x1, y1 = box
            out[max(y0, 0) : max(y1, 0), max(x0, 0) : max(x1, 0)] = int(label)
    return out


class FineCoverage(Metric):
    """Share of object cells and of class-boundary cells that get finest-level tokens.

    A finest-grid cell is an *object* cell if any of its pixels belongs to a non-background class,
    a *boundary* cell if its pixels hold at least two classes. SPLIT should spend its fine tokens
    there (the paper: 90.7% of object patches vs APT's 80.8%).

    Args:
        cell: finest patch size in pixels.
        ignore_index: unlabelled pixels.
        background: classes that are not objects.
    """

    full_state_update = False

    def __init__(self, cell: int, ignore_index: int = 255, background: Sequence[int] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        self.cell, self.ignore_index, self.background = cell, ignore_index, tuple(background)
        for name in ("object_fine", "object_total", "boundary_fine", "boundary_total"):
            self.add_state(name, torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, layout: TokenLayout, masks: Tensor) -> None:
        fine = layout.level_map() == layout.levels.num - 1
        if masks.shape[-2:] != (fine.shape[1] * self.cell, fine.shape[2] * self.cell):
            masks = F.interpolate(
                masks[:, None].float(),
                size=(fine.shape[1] * self.cell, fine.shape[2] * self.cell),
                mode="nearest",
            )[:, 0].long()
        is_object, boundary = cell_classes(masks, self.cell, self.ignore_index, self.background)
        self.object_fine += (fine & is_object).sum()
        self.object_total += is_object.sum()
        self.boundary_fine += (fine & boundary).sum()
        self.boundary_total += boundary.sum()

    def compute(self) -> dict[str, Tensor]:
        return {
            "object_fine_coverage": self.object_fine / self.object_total.clamp(min=1),
            "boundary_fine_coverage": self.boundary_fine / self.boundary_total.clamp(min=1),
        }


class PolicyStats(nn.Module):
    """Task metrics, token-fraction mean/std/max and throughput of one layout policy over an epoch."""

    def __init__(self, metrics: MetricCollection | Metric) -> None:
        super().__init__()
        self.metrics = metrics
        self.fraction = MeanMetric()
        self.fraction_sq = MeanMetric()
        self.fraction_max = MaxMetric()
        self.images = SumMetric()
        self.seconds = SumMetric()

    def update_layout(self, fraction: Tensor, seconds: float) -> None:
        fraction = fraction.detach().float()
        self.fraction.update(fraction)
        self.fraction_sq.update(fraction.square())
        self.fraction_max.update(fraction.max())
        self.images.update(torch.tensor(float(fraction.numel())))
        self.seconds.update(torch.tensor(seconds))

    def compute(self) -> dict[str, float]:
        mean = float(self.fraction.compute())
        var = max(float(self.fraction_sq.compute()) - mean * mean, 0.0)
        seconds = float(self.seconds.compute())
        values = {k: float(v) for k, v in _flatten(self.metrics.compute()).items()}
        values.update(
            token_fraction_mean=mean,
            token_fraction_std=math.sqrt(var),
            token_fraction_max=float(self.fraction_max.compute()),
            images_per_second=float(self.images.compute()) / seconds if seconds > 0 else float("nan"),
        )
        return values

    def reset(self) -> None:
        for m in (
            self.metrics,
            self.fraction,
            self.fraction_sq,
            self.fraction_max,
            self.images,
            self.seconds,
        ):
            m.reset()


def _flatten(values: dict[str, Any] | Tensor) -> dict[str, Tensor]:
    if isinstance(values, Tensor):
        return {"value": values}
    out = {}
    for k, v in values.items():
        if isinstance(v, Tensor) and v.numel() == 1:
            out[k] = v
    return out


@contextmanager
def timed(device: torch.device) -> Iterator[Callable[[], float]]:
    """Wall time of a block, synchronising CUDA so asynchronous kernels are counted."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    elapsed = [0.0]
    yield lambda: elapsed[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed[0] = time.perf_counter() - start
