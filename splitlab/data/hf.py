"""Hugging Face `datasets` splits as splitlab's readers take them: loaded from the hub, its cache or
``save_to_disk`` output, images handed over undecoded (so that one decoder reads them as it reads
files), rows converted into items with their columns checked up front."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset


def load_hf_splits(name: str, config: str | None = None, default_split: str = "train") -> Any:
    """A Hugging Face ``DatasetDict``: from ``save_to_disk`` output when ``name`` is a local folder,
    else ``datasets.load_dataset(name, config)`` (hub or its cache). A single split becomes
    ``{default_split: split}``."""
    import datasets

    path = Path(name).expanduser()
    if path.exists() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        parts = datasets.load_from_disk(str(path))
    else:
        try:
            parts = datasets.load_dataset(name, config)
        except OSError as err:  # a typo, the hub unreachable, no cached copy: one line, not 57
            raise OSError(
                f"data.hf_dataset={name!r}: could not be loaded ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:200]}); check the name (a hub dataset, or a folder written by "
                "save_to_disk), and without the hub set HF_HUB_OFFLINE=1 to read the local cache at once"
            ) from err
    if isinstance(parts, datasets.Dataset):
        parts = datasets.DatasetDict({default_split: parts})
    return parts


def undecoded_images(split: Any, columns: Sequence[str]) -> Any:
    """``split`` with its image ``columns`` handed over as stored (``{"bytes", "path"}``), for
    `splitlab.model.images` to decode as it decodes files: `datasets` would turn every image upright
    by its EXIF orientation whatever ``exif_transpose`` says, and convert it to a mode its feature
    declares first (a 16-bit image to white). Masks are not passed here: they stay as `datasets` reads them."""
    import datasets

    for column in columns:
        feature = split.features.get(column)
        if isinstance(feature, datasets.Image) and feature.decode:
            split = split.cast_column(column, datasets.Image(decode=False))
    return split


def image_source(value: Any) -> Any:
    """An image cell of `undecoded_images` as `decode_image` reads it: its bytes as a file object, or
    its local path; a remote path is fetched by `datasets` (its EXIF already applied); anything else
    (a PIL image) as it is."""
    if not isinstance(value, dict):
        return value
    if value.get("bytes") is not None:
        return io.BytesIO(value["bytes"])
    path = value.get("path")
    if path and Path(path).is_file():
        return path
    import datasets

    return datasets.Image().decode_example(value)


class HFRows(Dataset):
    """Items made from the rows of a `datasets` split by ``convert(row, name)``, columns checked up front.

    Args:
        split: a `datasets.Dataset`.
        columns: columns ``convert`` reads.
        convert: ``(row, item_name) -> item`` (the name identifies the row in error messages).
        name: the split, e.g. ``data.hf_dataset='x'[train]``.
    """

    def __init__(
        self, split: Any, columns: Sequence[str], convert: Callable[[dict[str, Any], str], Any], name: str
    ) -> None:
        missing = [c for c in columns if c not in split.column_names]
        if missing:
            raise ValueError(
                f"{name}: no column {missing} (columns: {split.column_names}); set image_column / label_column"
            )
        self.split, self.convert, self.name = split, convert, name

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> Any:
        return self.convert(self.split[index], f"{self.name}[{index}]")
