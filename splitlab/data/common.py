"""Pieces every splitlab DataModule shares: resumable shuffling and forgiving image loading."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    """Epoch-seeded shuffling, split across DDP ranks, that can resume in the middle of an epoch.

    The order is a pure function of ``(seed, epoch)`` (Lightning calls ``set_epoch``), so a
    resumed run draws exactly what the uninterrupted run would have. `skip` drops the samples a
    checkpoint already trained on from the next pass (see `splitlab.callbacks.ResumePosition`).
    Being a ``DistributedSampler``, Lightning leaves it in place under DDP instead of wrapping it.
    """

    def __init__(self, dataset: Any, seed: int = 0, shuffle: bool = True) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            replicas, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        else:
            replicas, rank = 1, 0
        super().__init__(dataset, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed)
        self._skip = 0

    def skip(self, samples: int) -> None:
        """Leave out the first ``samples`` indices (of this rank) of the next pass only."""
        self._skip = int(samples)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])


class SkipCorrupt(Dataset):
    """Wraps a dataset whose items may fail to decode: warn naming the file, serve the next item.

    Skipping (rather than stopping) keeps a long run alive on one bad file among millions; the
    warning names the file so it can be fixed, and ``skipped`` counts them.
    """

    def __init__(self, dataset: Any, describe: Callable[[int], str], max_skips: int = 16) -> None:
        self.dataset = dataset
        self.describe = describe
        self.max_skips = max_skips
        self.skipped: set[int] = set()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        for attempt in range(self.max_skips + 1):
            i = (index + attempt) % len(self.dataset)
            try:
                return self.dataset[i]
            except (
                OSError,
                SyntaxError,
            ) as err:  # PIL's errors for unreadable images (bad labels still raise)
                if i not in self.skipped:
                    self.skipped.add(i)
                    warnings.warn(f"skipping corrupt image {self.describe(i)}: {err}", stacklevel=2)
        raise RuntimeError(f"{self.max_skips + 1} consecutive unreadable images from {self.describe(index)}")


def require_dir(path: str | Path, setting: str) -> Path:
    """The directory at ``path``, or a FileNotFoundError naming the setting."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"{setting}={str(path)!r}: no such directory")
    return p


class SplitDataModule(LightningDataModule):
    """Loaders every splitlab DataModule shares: a `ResumableSampler` for training, dataset order for
    evaluation. Subclasses fill ``self.datasets`` (``train``, ``val`` and optionally ``test``) in
    ``setup`` and have ``batch_size``, ``num_workers`` and ``shuffle_seed`` hyperparameters."""

    collate_fn: Callable | None = None
    test_key = "val"  # the split `test` and `predict` read

    def _loader(self, key: str, shuffle: bool) -> DataLoader:
        hp, dataset = self.hparams, self.datasets[key]
        batch_size = getattr(
            self, "batch_size", hp.batch_size
        )  # an attribute, so Lightning's tuner can scale it
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=ResumableSampler(dataset, hp.shuffle_seed) if shuffle else None,
            num_workers=hp.num_workers,
            persistent_workers=hp.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            collate_fn=type(self).collate_fn,
            drop_last=shuffle and len(dataset) > batch_size,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_key, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_key, shuffle=False)
