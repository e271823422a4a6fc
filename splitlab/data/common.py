"""Pieces every splitlab DataModule shares: resumable shuffling and forgiving image loading."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler


class EpochShuffleSampler(Sampler[int]):
    """A shuffle that is a pure function of ``(seed, epoch)``.

    Lightning calls ``set_epoch`` before every epoch, so a resumed run draws exactly the order
    the uninterrupted run would have, whatever else consumed the global RNG meanwhile.
    """

    def __init__(self, length: int, seed: int = 0) -> None:
        self.length, self.seed, self.epoch = length, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.length, generator=gen).tolist())

    def __len__(self) -> int:
        return self.length


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
