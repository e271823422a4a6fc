"""Pieces every splitlab DataModule shares: its common settings, resumable shuffling, forgiving image
loading, padding (the Hugging Face splits: `splitlab.data.hf`)."""

from __future__ import annotations

import multiprocessing as mp
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

from splitlab.data.hf import HFRows, load_hf_splits, undecoded_images
from splitlab.model.images import check_high_depth
from splitlab.model.preprocess import Preprocessing


class SeededIndex(int):
    """A dataset index that carries the seed of its sample's random augmentation (see `SkipCorrupt`)."""

    seed: int

    def __new__(cls, index: int, seed: int) -> SeededIndex:
        self = super().__new__(cls, index)
        self.seed = seed
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # to DataLoader workers
        return SeededIndex, (int(self), self.seed)


@contextmanager
def seeded_augmentation(seed: int) -> Iterator[None]:
    """Seed torch's, Python's and NumPy's global generators (what timm and torchvision transforms
    draw from) for one sample, and restore them after, so the caller's streams are untouched.

    Only the CPU generator is seeded (transforms draw there): ``torch.manual_seed`` would also reset
    every CUDA generator, which ``fork_rng(devices=[])`` does not restore, so with ``num_workers=0``
    on a GPU the model's dropout would replay the last sample's seed."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class ResumableSampler(DistributedSampler):
    """Epoch-seeded shuffling, split across DDP ranks, that can resume in the middle of an epoch.

    The order is a pure function of ``(seed, epoch)`` (Lightning calls ``set_epoch``), so a
    resumed run draws exactly what the uninterrupted run would have. So do the augmentations: each
    index carries a seed that is a function of ``(seed, epoch, index)`` (`SeededIndex`), which the
    dataset wrapper uses for that sample alone, whatever the DataLoader's workers or the global
    generators did before (a resume re-seeds those). `skip` drops the samples a checkpoint already
    trained on from the next pass (see `splitlab.callbacks.ResumePosition`). Being a
    ``DistributedSampler``, Lightning leaves it in place under DDP instead of wrapping it.
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
        seeds = np.random.SeedSequence([self.seed, self.epoch]).generate_state(len(self.dataset), np.uint64)
        return iter(SeededIndex(i, int(seeds[i] >> np.uint64(1))) for i in indices[skip:])


class BadSample(ValueError):
    """A sample that cannot be used as the settings say (a label above ``num_classes``, a mask whose size
    differs from its image): skipped and counted like an unreadable image unless ``strict``."""


# PIL's errors for an unreadable image (a decompression bomb is one too large to trust)
UNREADABLE = (OSError, SyntaxError, Image.DecompressionBombError)
UNUSABLE = (*UNREADABLE, BadSample)  # what `SkipCorrupt` skips


def shared_counter() -> tuple[Any, str]:
    """A counter in shared memory and the start method of its context: the default one, read without
    fixing it (``mp.Value`` would, and a later ``set_start_method`` would then fail)."""
    method = mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]
    return mp.get_context(method).Value("i", 0), method


class SkipCorrupt(Dataset):
    """Wraps a dataset whose items may fail: warn naming the file, count it, serve the next item.

    Skipping (rather than stopping) keeps a long run alive on one bad file among millions: the
    warning names the file so it can be fixed, the count is reported at the end of each epoch
    (`splitlab.callbacks.SkippedSamples`), and ``strict`` turns it into an error at the first one.
    The count lives in shared memory, so samples skipped in DataLoader workers count too.

    Args:
        dataset: the wrapped dataset.
        describe: index -> the file (or row) to name in messages.
        strict: raise at the first bad sample instead of skipping it.
        max_skips: consecutive bad samples after which the data is considered broken.
    """

    def __init__(
        self, dataset: Any, describe: Callable[[int], str], strict: bool = False, max_skips: int = 16
    ) -> None:
        self.dataset = dataset
        self.describe = describe
        self.strict = strict
        self.max_skips = max_skips
        self.skipped: set[int] = set()
        self.count, self.count_context = shared_counter()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if not -len(self.dataset) <= index < len(self.dataset):  # `for x in dataset` must end
            raise IndexError(f"index {index} out of range for {len(self.dataset)} samples")
        for attempt in range(self.max_skips + 1):
            i = (index + attempt) % len(self.dataset)
            try:
                if isinstance(index, SeededIndex):
                    with seeded_augmentation(index.seed + attempt):
                        return self.dataset[i]
                return self.dataset[i]
            except UNUSABLE as err:
                self.skip(i, err)
        raise RuntimeError(f"{self.max_skips + 1} consecutive unusable samples from {self.describe(index)}")

    def __getstate__(self) -> dict[str, Any]:
        # Forked DataLoader workers inherit the shared counter. Spawned ones (the default start
        # method on macOS, forkserver on Linux from Python 3.14) receive it pickled while the worker
        # is being spawned, the one time a shared value may be pickled, unless it was made in a
        # fork context (a loader whose multiprocessing_context differs from the default). Any
        # other pickle (a deepcopy, a saved object), and those workers, count on their own.
        spawning = mp.context.get_spawning_popen() is not None
        shared = spawning and self.count_context != "fork"
        return {**self.__dict__, "count": self.count if shared else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.count is None:
            self.count, self.count_context = shared_counter()

    def skip(self, index: int, err: Exception) -> None:
        """Count an unusable sample and warn once about it (``strict``: stop instead)."""
        if self.strict:
            raise BadSample(f"{self.describe(index)}: {err} (data.init_args.strict=true)") from None
        with self.count.get_lock():
            self.count.value += 1
        if index not in self.skipped:
            self.skipped.add(index)
            warnings.warn(f"skipping {self.describe(index)}: {err}", stacklevel=3)

    def get_or_none(self, index: int) -> Any:
        """Item ``index`` itself, or None (warned about and counted) where it is unusable: what
        prediction needs, whose rows must each be the file they name, never the next one."""
        try:
            return self.dataset[index]
        except UNUSABLE as err:
            self.skip(index, err)
            return None

    def take_count(self) -> int:
        """Samples skipped since the last call."""
        with self.count.get_lock():
            value, self.count.value = self.count.value, 0
        return value


class Sourced(Dataset):
    """A dataset for prediction: each item is ``(source, item)`` where ``source`` names the sample
    (``dataset_index``, and ``file`` where there is one); an unusable sample's item is None."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[dict[str, Any], Any]:
        source: dict[str, Any] = {"dataset_index": int(index)}
        if isinstance(self.dataset, SkipCorrupt):
            source["file"] = self.dataset.describe(index)
            return source, self.dataset.get_or_none(index)
        return source, self.dataset[index]


class SourcedCollate:
    """Collate `Sourced` items: the usable ones with the data module's own collate, their sources
    appended as the batch's last element (a batch with none left is None: no rows)."""

    def __init__(self, collate: Callable | None) -> None:
        self.collate = collate or default_collate

    def __call__(self, batch: list[tuple[dict[str, Any], Any]]) -> tuple[Any, ...] | None:
        kept = [(source, item) for source, item in batch if item is not None]
        if not kept:
            return None
        return (*self.collate([item for _, item in kept]), [source for source, _ in kept])


def check_source(root: str | None, hf_dataset: str | None, layout: str) -> None:
    """Exactly one source of data: a folder in the task's file ``layout``, or a Hugging Face dataset."""
    if (root is None) == (hf_dataset is None):
        raise ValueError(f"set exactly one of data.root ({layout}) and data.hf_dataset")


def square_side(img_size: int | Sequence[int], reader: str) -> int:
    """The side of a square input; a non-square one is refused naming the model's setting (this reader
    letterboxes every image into a square; classification takes any ``[height, width]``)."""
    if isinstance(img_size, int):
        return img_size
    sides = [int(v) for v in img_size]
    if len(sides) == 2 and sides[0] == sides[1]:
        return sides[0]
    raise ValueError(
        f"data.init_args.img_size={sides}: {reader} letterboxes images into a square, so give the model a "
        f"square input (model.init_args.backbone_kwargs.img_size: {max(sides)}); non-square inputs are for "
        "classification"
    )


def require_dir(path: str | Path, setting: str) -> Path:
    """The directory at ``path``, or a FileNotFoundError naming the setting."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"{setting}={str(path)!r}: no such directory")
    return p


class BaseDataModule(LightningDataModule):
    """The settings and loaders every splitlab DataModule shares: a `ResumableSampler` for training,
    dataset order for evaluation. Subclasses fill ``self.datasets`` (``train``, ``val`` and optionally
    ``test``) in ``setup``, and take these settings as ``**kwargs`` (each states its own defaults of
    ``img_size`` and ``batch_size``, and VQA its ``mean`` and ``std``), so each is said once.

    Args:
        img_size: the input side (the backbone's), or ``[height, width]`` where the data module takes a
            non-square input (classification); a square one is refused elsewhere, naming the setting.
        mean, std: normalisation (the backbone's pretrained config).
        batch_size: samples per batch (an attribute too, so Lightning's tuner can scale it).
        num_workers: DataLoader worker processes.
        shuffle_seed: seed of the epoch shuffles.
        strict: stop at the first unusable sample (an unreadable image; where the data has them, a
            label above ``num_classes`` or a mask whose size differs from its image) instead of
            skipping and counting it.
        exif_transpose: read images upright by their EXIF orientation (phone photos; boxes and masks
            are drawn on the upright image, masks themselves read as stored); off reads the pixels as
            stored. The model keeps it, so ``predict`` reads files alike. Files are decoded as
            `splitlab.model.images` says (16-bit as ``high_depth`` says, alpha dropped, ...).
        high_depth: how 16-bit, 32-bit and float images become 8 bits: ``range`` (the default: each
            image by its own minimum and maximum) or ``dtype`` (by the type's range, as an 8-bit file
            is read: an 8-bit file and its 16-bit twin alike); `splitlab.model.images`. The model
            keeps it, so ``predict`` reads files alike.
    """

    collate_fn: Callable | None = None
    test_key = "val"  # the split `test` and `predict` read
    object_annotations = False  # whether its targets say where the objects are (the oracle row reads them)
    square: str | None = None  # a reader that letterboxes into a square, named where img_size is not

    def __init__(
        self,
        img_size: int | Sequence[int] = 224,
        mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
        std: Sequence[float] = IMAGENET_DEFAULT_STD,
        batch_size: int = 64,
        num_workers: int = 4,
        shuffle_seed: int = 0,
        strict: bool = False,
        exif_transpose: bool = True,
        high_depth: str = "range",
    ) -> None:
        super().__init__()
        if self.square is not None:
            img_size = square_side(img_size, self.square)
        elif not isinstance(img_size, int):
            img_size = [int(v) for v in img_size]
        check_high_depth(high_depth, "data.init_args.high_depth")
        self.save_hyperparameters()  # the subclasses' own arguments too (Lightning reads their frames)
        self.hparams["img_size"] = img_size  # as read here, not as the subclass was given it
        self.mean, self.std, self.img_size = tuple(mean), tuple(std), img_size
        self.batch_size = batch_size
        self.datasets: dict[str, Dataset] = {}

    def model_input(self, **settings: Any) -> Preprocessing:
        """The model's `Preprocessing` at this module's size, normalisation and reading of files, with
        the data module's own ``settings`` (resize, interpolation, padding)."""
        hp = self.hparams
        return Preprocessing(
            self.img_size,
            self.mean,
            self.std,
            exif_transpose=hp.exif_transpose,
            high_depth=hp.high_depth,
            **settings,
        )

    def hf_splits(self) -> Any:
        """The ``hf_dataset`` (with ``hf_config``) as a ``DatasetDict``, loaded once per DataModule."""
        if getattr(self, "_hf", None) is None:
            hp = self.hparams
            self._hf = load_hf_splits(hp.hf_dataset, hp.get("hf_config"), hp.get("train_split", "train"))
        return self._hf

    def hf_rows(
        self,
        name: str,
        columns: Sequence[str],
        convert: Callable[[dict[str, Any], str], Any],
        images: Sequence[str] = (),
    ) -> Dataset | None:
        """Split ``name`` of ``hf_dataset`` as an `HFRows` dataset that skips undecodable images, or None;
        ``images`` (columns) reach ``convert`` undecoded (`undecoded_images`, read with `image_source`)."""
        splits = self.hf_splits()
        if name not in splits:
            return None
        split = undecoded_images(splits[name], images)
        rows = HFRows(split, columns, convert, f"data.hf_dataset={self.hparams.hf_dataset!r}[{name}]")
        return SkipCorrupt(rows, lambda i: f"{rows.name}[{i}]", self.hparams.get("strict", False))

    def missing_split(self, setting: str, name: str, under: str = "") -> FileNotFoundError:
        """The error for a split that is not there, naming the setting and listing the splits that
        are (``scene_parse_150`` on the hub calls ADE20K's ``training`` split ``train``)."""
        hp = self.hparams
        if hp.get("root") is not None:
            folder = Path(hp.root) / under
            have = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
            where = f"data.root={hp.root!r}" + (f" ({under}/)" if under else "")
        else:
            have, where = sorted(self.hf_splits()), f"data.hf_dataset={hp.hf_dataset!r}"
        return FileNotFoundError(f"data.{setting}={name!r}: no such split in {where}; splits: {have}")

    def skipped_report(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> str | None:
        """How many samples were skipped since the last report, or None.

        Args:
            reduce: sums a tensor over the DDP ranks (every rank must call then), so a file
                skipped on any rank is counted, not only those rank 0 read.
        """
        keys = sorted(key for key, ds in self.datasets.items() if isinstance(ds, SkipCorrupt))
        if not keys:
            return None
        taken = torch.tensor([self.datasets[key].take_count() for key in keys])
        if reduce is not None:
            taken = reduce(taken)
        counts = {key: int(n) for key, n in zip(keys, taken.tolist(), strict=True) if n}
        if not counts:
            return None
        listing = ", ".join(f"{n} in {key}" for key, n in counts.items())
        return f"skipped {sum(counts.values())} read(s) of unusable samples ({listing}); the warnings above name the files"

    def _loader(self, key: str, shuffle: bool) -> DataLoader:
        hp, dataset = self.hparams, self.datasets[key]
        batch_size = getattr(
            self, "batch_size", hp.batch_size
        )  # an attribute, so Lightning's tuner can scale it
        sampler = ResumableSampler(dataset, hp.shuffle_seed) if shuffle else None
        per_rank = len(sampler) if sampler is not None else len(dataset)  # under DDP a rank's share
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=hp.num_workers,
            persistent_workers=hp.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            collate_fn=type(self).collate_fn,
            drop_last=shuffle and per_rank > batch_size,  # a short last batch, unless it is the only one
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_key, shuffle=False)

    def use_for_predict(self, dataset: Dataset, split: str) -> None:
        """Predict on ``dataset`` (the ``split`` named), and say which split that is."""
        self.datasets["predict"] = dataset
        rank_zero_info(f"splitlab: predict reads the {split!r} split ({len(dataset)} samples)")

    def predict_dataloader(self) -> DataLoader:
        """The predict split in dataset order; each batch ends with its samples' sources (index and
        file), and an unusable file gives no row (`Sourced`)."""
        hp = self.hparams
        dataset = self.datasets["predict" if "predict" in self.datasets else self.test_key]
        return DataLoader(
            Sourced(dataset),
            batch_size=getattr(self, "batch_size", hp.batch_size),
            num_workers=hp.num_workers,
            pin_memory=torch.cuda.is_available(),
            collate_fn=SourcedCollate(type(self).collate_fn),
        )


class FolderOrHubData(BaseDataModule):
    """A data module that reads either a folder in its task's file layout or a Hugging Face dataset.

    Args:
        root: the folder, in the layout the data module names.
        hf_dataset: a Hugging Face dataset instead: a hub name or a local path (``save_to_disk`` output,
            or anything ``datasets.load_dataset`` loads).
        hf_config: its configuration name.
        predict_split: the split ``predict`` reads (default: the validation split; classification's
            test split where the data has one); one the data does not have is refused.
        **kwargs: `BaseDataModule`'s settings.
    """

    layout = "its task's layout"  # names the folder's layout in the one-source error

    def __init__(
        self,
        root: str | None = None,
        hf_dataset: str | None = None,
        hf_config: str | None = None,
        predict_split: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_source(root, hf_dataset, self.layout)
