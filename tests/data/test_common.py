"""Shared data pieces: resumable order and per-sample seeded augmentation."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from splitlab.data import ResumableSampler, SeededIndex, SkipCorrupt
from splitlab.data.common import SplitDataModule


class RandomDraws(Dataset):
    """Each item: its index and one draw from each global generator, as a random transform makes."""

    def __init__(self, size: int = 12) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item(), random.random(), np.random.rand()])


def draws(epoch: int, workers: int = 0, skip: int = 0) -> torch.Tensor:
    dataset = SkipCorrupt(RandomDraws(), str)
    sampler = ResumableSampler(dataset, seed=3)
    sampler.set_epoch(epoch)
    sampler.skip(skip)
    return torch.cat(list(DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers)))


def test_augmentation_is_a_function_of_seed_epoch_and_index() -> None:
    """What a resumed run needs: the same draws whatever ran before, in workers or not, after a skip."""
    torch.manual_seed(0)
    first = draws(epoch=1)
    torch.manual_seed(123)  # a resume re-seeds the global generators: nothing changes
    random.seed(5)
    assert torch.equal(draws(epoch=1), first)
    assert torch.equal(draws(epoch=1, workers=2), first)
    assert torch.equal(draws(epoch=1, skip=4), first[4:])  # mid-epoch resume
    other = draws(epoch=2)
    by_index = {int(row[0]): row[1:] for row in other}
    assert all(not torch.equal(by_index[int(row[0])], row[1:]) for row in first)  # a new epoch, new draws
    assert len({tuple(row[1:].tolist()) for row in first}) == len(first)  # each sample its own


def test_seeded_samples_leave_the_callers_generators_alone() -> None:
    """Seeding a sample in the main process (num_workers=0) must not reset the model's randomness."""
    dataset = SkipCorrupt(RandomDraws(), str)
    torch.manual_seed(7)
    random.seed(7)
    expected = (torch.rand(()).item(), random.random())
    torch.manual_seed(7)
    random.seed(7)
    seeded = dataset[SeededIndex(2, 99)]
    assert (torch.rand(()).item(), random.random()) == pytest.approx(expected)
    assert torch.equal(dataset[SeededIndex(2, 99)], seeded) and not torch.equal(dataset[2], seeded)


def test_seeded_samples_leave_the_cuda_generators_alone(monkeypatch) -> None:
    """A GPU's generators are not reseeded either (the CPU-only machine: watch the call that would)."""
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: reseeded.append(seed))
    SkipCorrupt(RandomDraws(), str)[SeededIndex(2, 99)]
    assert reseeded == []


class TinyData(SplitDataModule):
    def __init__(self, size: int, batch_size: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.hparams.update(num_workers=0, shuffle_seed=0)
        self.datasets = {"train": SkipCorrupt(RandomDraws(size), str)}


@pytest.mark.parametrize(("ranks", "batches"), [(1, 2), (4, 1)], ids=["one-process", "four-ranks"])
def test_the_last_short_batch_is_dropped_only_when_a_rank_has_more(monkeypatch, ranks, batches) -> None:
    """20 images in batches of 8: one process trains 2 full batches (the short third dropped); on 4
    ranks each holds 5 images, so its one short batch is kept (dropping it left no batch at all)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: ranks > 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: ranks)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    assert len(TinyData(20, 8).train_dataloader()) == batches
