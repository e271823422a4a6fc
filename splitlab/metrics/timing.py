"""Wall time of a block of work on any device: the one timer of evaluation and `splitlab bench`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued kernels (CUDA runs asynchronously; other devices need no wait)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(device: torch.device) -> Iterator[Callable[[], float]]:
    """Wall time of a block, synchronising CUDA before and after so that asynchronous kernels are
    counted in the block that queued them.

    Yields:
        a callable that returns the block's seconds once the block has ended (0.0 inside it).
    """
    synchronize(device)
    start = time.perf_counter()
    elapsed = [0.0]
    yield lambda: elapsed[0]
    synchronize(device)
    elapsed[0] = time.perf_counter() - start
