"""Shared data pieces: resumable order and per-sample seeded augmentation."""

from __future__ import annotations

import copy
import multiprocessing
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from splitlab.data import ResumableSampler, SeededIndex, SkipCorrupt
from splitlab.data.common import BaseDataModule


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


class TinyData(BaseDataModule):
    def __init__(self, size: int, batch_size: int) -> None:
        super().__init__(batch_size=batch_size, num_workers=0, shuffle_seed=0)
        self.datasets = {"train": SkipCorrupt(RandomDraws(size), str)}


@pytest.mark.parametrize(("ranks", "batches"), [(1, 2), (4, 1)], ids=["one-process", "four-ranks"])
def test_the_last_short_batch_is_dropped_only_when_a_rank_has_more(monkeypatch, ranks, batches) -> None:
    """20 images in batches of 8: one process trains 2 full batches (the short third dropped); on 4
    ranks each holds 5 images, so its one short batch is kept (dropping it left no batch at all)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: ranks > 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: ranks)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    assert len(TinyData(20, 8).train_dataloader()) == batches


class SomeUnreadable(RandomDraws):
    """Item 3 fails as an unreadable image does, item 7 as one too large for PIL to trust."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 3:
            raise OSError("cannot identify image file")
        if index == 7:
            raise Image.DecompressionBombError("Image size (200000000 pixels) exceeds limit")
        return super().__getitem__(index)


@pytest.mark.parametrize(("workers", "start"), [(0, None), (2, "fork"), (1, "spawn")])
def test_samples_skipped_in_workers_are_counted(workers, start) -> None:
    """The end-of-epoch report counts samples skipped inside DataLoader worker processes too, forked
    or spawned (the count is shared memory), once per read, and starts from zero after each report.
    Spawned workers are tested as on macOS or Python 3.14, where spawn (forkserver) is the default
    context, so the counter is made in it."""
    dataset = SkipCorrupt(SomeUnreadable(), str)
    if start == "spawn":
        dataset.count, dataset.count_context = multiprocessing.get_context("spawn").Value("i", 0), "spawn"
    loader = DataLoader(dataset, batch_size=3, num_workers=workers, multiprocessing_context=start)
    with warnings.catch_warnings():  # a worker's warning goes to its own stderr, not to the parent
        warnings.simplefilter("ignore")
        items = torch.cat(list(loader))
    assert items[:, 0].tolist() == [0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10, 11]  # each bad one served its next
    assert dataset.take_count() == 2 and dataset.take_count() == 0
    assert copy.deepcopy(dataset).count is not dataset.count  # pickled outside a spawn: its own counter


def test_a_fork_made_counter_does_not_stop_spawned_workers() -> None:
    """A loader whose context differs from the default (spawn on Linux): the workers count on their
    own rather than failing to receive a fork-made counter."""
    dataset = SkipCorrupt(SomeUnreadable(), str)
    dataset.count_context = "fork"
    loader = DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert len(torch.cat(list(loader))) == 12


def test_the_counter_leaves_the_start_method_unset() -> None:
    """Building a data module must not fix the process's start method (a user's later
    ``set_start_method`` would fail with "context has already been set")."""
    script = (
        "import multiprocessing as mp; from splitlab.data import SkipCorrupt; SkipCorrupt([], str); "
        "assert mp.get_start_method(allow_none=True) is None; mp.set_start_method('spawn')"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_padding_moves_boxes_with_their_image() -> None:
    """Boxes get the padded image's canvas (not one computed from their own (N, 4) shape), and centred
    padding shifts them with the image."""
    from torchvision import tv_tensors

    from splitlab.model.preprocess import PadTo

    image = tv_tensors.Image(torch.zeros(3, 40, 64))
    boxes = tv_tensors.BoundingBoxes([[0, 0, 10, 10], [50, 30, 64, 40]], format="XYXY", canvas_size=(40, 64))
    for centre, shift in ((False, 0), (True, 12)):
        padded, moved = PadTo(64, centre=centre)(image, boxes)
        assert padded.shape == (3, 64, 64) and moved.canvas_size == (64, 64)
        assert moved.tolist() == [[0, shift, 10, 10 + shift], [50, 30 + shift, 64, 40 + shift]]


SHARED = {
    "img_size",
    "mean",
    "std",
    "batch_size",
    "num_workers",
    "shuffle_seed",
    "strict",
    "exif_transpose",
    "high_depth",
}


def data_module(kind: str, root) -> BaseDataModule:
    """Each task's data module with nothing but a root in its layout: every other setting its default."""
    from splitlab.data import ADE20KData, CocoDetectionData, ImageClassificationData, VQAv2Data

    folders = {
        "classification": ["train"],
        "detection": [],
        "segmentation": ["images/training", "annotations/training"],
        "vqa": [],
    }[kind]
    root.mkdir(exist_ok=True)
    for folder in folders:
        (root / folder).mkdir(parents=True, exist_ok=True)
    module = {
        "classification": ImageClassificationData,
        "detection": CocoDetectionData,
        "segmentation": ADE20KData,
        "vqa": VQAv2Data,
    }[kind]
    return module(root=str(root))


@pytest.mark.parametrize(
    ("kind", "img_size", "batch_size", "mean"),
    [
        ("classification", 224, 64, (0.485, 0.456, 0.406)),
        ("detection", 1024, 2, (0.485, 0.456, 0.406)),
        ("segmentation", 512, 16, (0.485, 0.456, 0.406)),
        ("vqa", 336, 8, (0.48145466, 0.4578275, 0.40821073)),
    ],
)
def test_each_data_module_passes_the_shared_settings_on_with_its_own_defaults(
    tmp_path, kind, img_size, batch_size, mean
) -> None:
    """The settings every data module shares are the base's, passed on as ``**kwargs``: still each
    module's hyperparameters, with its own defaults where it has them, and settable by name."""
    data = data_module(kind, tmp_path / "default")
    hp = data.hparams
    assert set(hp) >= SHARED and hp.root == str(tmp_path / "default")
    assert (hp.img_size, data.img_size, hp.batch_size, data.batch_size) == (
        img_size,
        img_size,
        batch_size,
        batch_size,
    )
    assert tuple(data.mean) == pytest.approx(mean) and (hp.num_workers, hp.high_depth, hp.strict) == (
        4,
        "range",
        False,
    )
    assert data.preprocessing.img_size == img_size and data.preprocessing.exif_transpose
    module, root = type(data), tmp_path / "default"
    given = module(root=str(root), num_workers=0, exif_transpose=False, high_depth="dtype", img_size=[64, 64])
    assert (given.hparams.num_workers, given.hparams.high_depth, given.hparams.exif_transpose) == (
        0,
        "dtype",
        False,
    )
    side = (
        [64, 64] if kind == "classification" else 64
    )  # a square [h, w] is a side to the letterboxing readers
    assert given.hparams.img_size == side and given.img_size == side
    with pytest.raises(ValueError, match="data.init_args.high_depth"):
        module(root=str(root), high_depth="bits")
