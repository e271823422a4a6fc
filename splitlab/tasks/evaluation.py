"""Side-by-side evaluation of the learned layout and the baselines, and the run's `summary.json`."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric, MetricCollection, SumMetric


class PolicyStats(nn.Module):
    """Task metrics, token-fraction mean/std and throughput of one layout policy over an epoch."""

    def __init__(self, metrics: MetricCollection | Metric) -> None:
        super().__init__()
        self.metrics = metrics
        self.fraction = MeanMetric()
        self.fraction_sq = MeanMetric()
        self.images = SumMetric()
        self.seconds = SumMetric()

    def update_layout(self, fraction: Tensor, seconds: float) -> None:
        fraction = fraction.detach().float()
        self.fraction.update(fraction)
        self.fraction_sq.update(fraction.square())
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
            images_per_second=float(self.images.compute()) / seconds if seconds > 0 else float("nan"),
        )
        return values

    def reset(self) -> None:
        for m in (self.metrics, self.fraction, self.fraction_sq, self.images, self.seconds):
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


def summary_record(
    task: str,
    metric: str,
    target_fraction: float,
    lam: float,
    policies: dict[str, dict[str, float]],
    stage: str,
) -> dict[str, Any]:
    """The content of `summary.json`: one row per evaluated layout policy."""
    rows = {}
    for name, values in policies.items():
        rows[name] = {
            "metric": values.get(metric, float("nan")),
            "token_fraction_mean": values["token_fraction_mean"],
            "token_fraction_std": values["token_fraction_std"],
            "images_per_second": values["images_per_second"],
            **{
                k: v
                for k, v in values.items()
                if k not in ("token_fraction_mean", "token_fraction_std", "images_per_second")
            },
        }
    return {
        "task": task,
        "metric": metric,
        "stage": stage,
        "target_fraction": target_fraction,
        "lambda": lam,
        "policies": rows,
    }


def write_summary(record: dict[str, Any], directory: str | Path) -> Path:
    """Write `summary.json` (NaN as null, so any JSON reader takes it)."""
    path = Path(directory) / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = json.loads(json.dumps(record, allow_nan=True).replace("NaN", "null"))
    path.write_text(json.dumps(clean, indent=2) + "\n")
    return path


def format_table(record: dict[str, Any]) -> str:
    """The comparison as a fixed-width text table."""
    metric = record["metric"]
    header = f"{'policy':<10} {metric:>10} {'fraction':>10} {'± std':>8} {'img/s':>10}"
    lines = [
        f"{record['task']} ({record['stage']}): target fraction {record['target_fraction']:.2f}, lambda {record['lambda']:.4f}",
        header,
        "-" * len(header),
    ]
    for name, row in record["policies"].items():
        value = row["metric"]
        shown = "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
        lines.append(
            f"{name:<10} {shown:>10} {row['token_fraction_mean']:>10.3f} {row['token_fraction_std']:>8.3f} "
            f"{row['images_per_second']:>10.1f}"
        )
    return "\n".join(lines)


class PolicyEvaluation:
    """Evaluation half of `SplitTask`: the learned layout beside the baselines, summary, predictions."""

    def _evaluate_baselines(self) -> bool:
        trainer = self.trainer
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != "fit":
            return True
        return trainer.current_epoch + 1 >= (trainer.max_epochs or 0)

    def _eval_step(self, batch: Any, batch_idx: int, split: str) -> dict[str, Any]:
        images, targets = self.split_batch(batch)
        stats = getattr(self, f"{split}_stats")
        with timed(images.device) as elapsed:
            outputs, layout = self(images, policy=self.deployed_policy)
        learned = stats["learned"]
        learned.update_layout(layout.fraction, elapsed())
        self.update_metrics(learned.metrics, outputs, targets, layout)
        if self._evaluate_baselines():
            realised = float(layout.fraction.mean())
            for policy in self.hparams.eval_baselines:
                if policy == self.deployed_policy:
                    continue
                with timed(images.device) as elapsed:
                    base_out, base_layout = self(
                        images,
                        policy=policy,
                        fraction=max(realised, self.levels.min_fraction),
                        seed=batch_idx,
                    )
                stats[policy].update_layout(base_layout.fraction, elapsed())
                self.update_metrics(stats[policy].metrics, base_out, targets, base_layout)
        return {"images": images, "layout": layout} if batch_idx == 0 else {}

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "test")

    def _eval_epoch_end(self, split: str) -> None:
        stats = getattr(self, f"{split}_stats")
        results = {}
        for policy, stat in stats.items():
            if not stat.images.update_called:
                stat.reset()
                continue
            results[policy] = stat.compute()
            stat.reset()
        if "learned" not in results:
            return
        learned = results["learned"]
        self.log(
            f"{split}/{self.metric_name}",
            learned.get(self.metric_name, float("nan")),
            prog_bar=True,
            sync_dist=False,
        )
        self.log(f"{split}/fraction", learned["token_fraction_mean"], prog_bar=True)
        self.log(f"{split}/fraction_std", learned["token_fraction_std"], prog_bar=True)
        self.log("lambda", self.controller.value, prog_bar=True)
        for policy, values in results.items():
            if policy != "learned":
                self.log(f"{split}/{policy}/{self.metric_name}", values.get(self.metric_name, float("nan")))
                self.log(f"{split}/{policy}/fraction", values["token_fraction_mean"])
        if not self._evaluate_baselines():  # the summary is written at the end of fit, validate and test
            return
        if self.deployed_policy != "learned":  # a dense (pretraining) run deploys the uniform grid
            results = {self.deployed_policy: results.pop("learned"), **results}
        record = summary_record(
            self.task_name,
            self.metric_name,
            self.target_fraction,
            self.controller.value,
            results,
            str(self.trainer.state.fn.value),
        )
        self.last_summary = record
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir
        if self.trainer.is_global_zero:
            write_summary(record, log_dir)
            rank_zero_info("\n" + format_table(record))

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Each image's layout (token boxes in pixels, levels, fraction) and the task output."""
        images, _ = self.split_batch(batch) if isinstance(batch, list | tuple) else (batch, None)
        outputs, layout = self(images)
        finest = self.levels.finest
        records = []
        for i, (boxes, levels) in enumerate(
            zip(layout.split(layout.boxes), layout.split(layout.level), strict=True)
        ):
            records.append(
                {
                    "batch": batch_idx,
                    "index": i,
                    "token_fraction": float(layout.fraction[i]),
                    "tokens": [
                        [*(b * finest).tolist(), int(lv)] for b, lv in zip(boxes, levels, strict=True)
                    ],
                    "prediction": self.describe_prediction(outputs, i),
                }
            )
        return records

    def describe_prediction(self, outputs: Any, index: int) -> Any:
        """A JSON-friendly summary of one image's prediction."""
        return None
