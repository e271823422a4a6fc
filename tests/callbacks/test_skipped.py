"""`SkippedSamples`: skipped reads are summed over ranks and reported in every kind of run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset

from splitlab.callbacks import SkippedSamples
from splitlab.data import SkipCorrupt
from splitlab.data.common import BaseDataModule


class OneUnreadable(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 1:
            raise OSError("truncated")
        return index


def rank_with_a_bad_read(ranks: int) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A trainer of ``ranks`` ranks, seen from one whose validation set skipped one read; every
    other rank skipped one too (the reduce sums them)."""
    data = BaseDataModule()
    data.datasets = {"val": SkipCorrupt(OneUnreadable(), str), "train": SkipCorrupt(OneUnreadable(), str)}
    with pytest.warns(UserWarning, match="skipping 1: truncated"):
        data.datasets["val"][1]
    strategy = SimpleNamespace(reduce=lambda t, reduce_op: t * ranks if reduce_op == "sum" else None)
    trainer = SimpleNamespace(datamodule=data, strategy=strategy, state=SimpleNamespace(fn="validate"))
    return trainer, SimpleNamespace(device=torch.device("cpu"))


def test_a_validate_run_reports_the_reads_skipped_on_every_rank(recwarn) -> None:
    trainer, module = rank_with_a_bad_read(ranks=4)
    callback = SkippedSamples()
    callback.on_validation_end(trainer, module)
    reports = [str(w.message) for w in recwarn if "read(s) of unusable samples" in str(w.message)]
    assert reports == [
        "validate: skipped 4 read(s) of unusable samples (4 in val); the warnings above name the files"
    ]
    callback.on_validation_end(trainer, module)  # counted once: nothing new to report
    assert len([w for w in recwarn if "read(s) of unusable" in str(w.message)]) == 1
