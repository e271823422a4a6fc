"""Wall time of a block of work on any device: the one timer of evaluation and `splitlab bench`, and
the interleaved timing of two paths that `splitlab bench` and the scripts compare."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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


def interleaved(
    run_uniform: Callable[[], Any],
    run_split: Callable[[], Any],
    warmup: int,
    iters: int,
    device: torch.device,
    min_seconds: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Seconds of each timed call of each path, after ``warmup`` discarded ones, the two paths
    alternating so that drifts of a shared machine hit both alike: at least ``iters`` pairs, and more
    until each path has run ``min_seconds`` (a short batch timed a few times is noise)."""
    for _ in range(warmup):
        run_uniform()
        run_split()
    uniform: list[float] = []
    split: list[float] = []
    while len(uniform) < iters or min(sum(uniform), sum(split)) < min_seconds:
        with timed(device) as elapsed:
            run_uniform()
        uniform.append(elapsed())
        with timed(device) as elapsed:
            run_split()
        split.append(elapsed())
    return uniform, split


def pair_spread(uniform: Sequence[float], split: Sequence[float]) -> dict[str, float]:
    """The speed-up of each timed pair (uniform over SPLIT, same batch, back to back): its
    quartiles, so that a table says how far one measurement can be trusted."""
    ratios = torch.tensor([u / s for u, s in zip(uniform, split, strict=True)], dtype=torch.float64)
    low, median, high = torch.quantile(ratios, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return {"pairs": len(ratios), "q1": low, "median": median, "q3": high}
