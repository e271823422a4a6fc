"""`LayoutWriter`: writes each predicted image's layout as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter


class LayoutWriter(BasePredictionWriter):
    """Append every image's layout and prediction to ``<output_dir>/layouts.jsonl`` (rank-suffixed under
    DDP), each with the index of its image in the dataset.

    Args:
        output_dir: where to write; the run's log dir by default.
    """

    def __init__(self, output_dir: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = output_dir
        self.path: Path | None = None

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        directory = Path(self.output_dir or trainer.log_dir or trainer.default_root_dir)
        suffix = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        self.path = directory / f"layouts{suffix}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        assert self.path is not None
        indices = list(batch_indices) if batch_indices is not None else [None] * len(prediction)
        with self.path.open("a") as f:
            for record, index in zip(prediction, indices, strict=True):
                # under DDP a rank's batches are every n-th sample: the dataset index says which image
                record = record if index is None else {"dataset_index": int(index), **record}
                f.write(json.dumps(record) + "\n")
