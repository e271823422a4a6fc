"""`LayoutWriter`: writes each predicted image's layout as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter


class LayoutWriter(BasePredictionWriter):
    """Append every image's layout and prediction to ``<output_dir>/layouts.jsonl`` (rank-suffixed under
    DDP), each with its source: the image's index in the dataset and its file.

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
        with self.path.open("a") as f:
            # each record names its sample (the task reads the source from the batch): under DDP a
            # rank's batches are every n-th sample, and a skipped file has no record
            for record in prediction:
                f.write(json.dumps(record) + "\n")
