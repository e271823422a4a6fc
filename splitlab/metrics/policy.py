"""Per-policy statistics: a task's metrics with the token fraction and throughput of one layout policy,
as the comparison table reports them."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric, Metric, MetricCollection, SumMetric


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
