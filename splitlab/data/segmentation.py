"""`ADE20KData`: semantic segmentation from the ADE20K layout (or a Hugging Face dataset).

ADE20K's standard layout: ``images/{training,validation}/*.jpg`` and
``annotations/{training,validation}/*.png`` index PNGs where 0 means "unlabelled" and 1..150 are
the classes. Labels are shifted down by one with 0 -> ``ignore_index`` (mmseg's
``reduce_zero_label``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from tqdm.auto import tqdm

from splitlab.data.common import (
    UNREADABLE,
    BadSample,
    FolderOrHubData,
    SkipCorrupt,
    require_dir,
)
from splitlab.data.hf import image_source
from splitlab.model.images import ImageDecoder, decoded_size
from splitlab.model.preprocess import Preprocessing

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CHECKED_LABELS = 16  # masks whose labels are read before training (all sizes are, from the headers)


class SegmentationFolder(Dataset):
    """(image, mask) pairs from two parallel folders; labels checked against ``num_classes``. Images
    are decoded upright by their EXIF orientation unless ``exif_transpose`` is off (`ImageDecoder`);
    masks are read as stored (index PNGs, not pictures)."""

    def __init__(
        self,
        images: Path,
        annotations: Path,
        num_classes: int,
        ignore_index: int,
        transform: Any,
        reduce_zero_label: bool = True,
        checked_labels: int = CHECKED_LABELS,
        exif_transpose: bool = True,
        high_depth: str = "range",
    ) -> None:
        files = sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"{images}: no images")
        self.pairs = []
        missing = []
        for f in files:
            ann = annotations / f"{f.stem}.png"
            (self.pairs if ann.exists() else missing).append((f, ann) if ann.exists() else f)
        if missing:
            raise FileNotFoundError(
                f"{annotations}: no annotation PNG for {len(missing)} image(s), e.g. {missing[0].name}"
            )
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.transform, self.reduce_zero_label = transform, reduce_zero_label
        self.decode = ImageDecoder(exif_transpose, high_depth)
        self.check(checked_labels)

    def check(self, labelled: int) -> None:
        """Before training: every mask has its image's size (headers only, cheap), and the first
        ``labelled`` masks hold only labels below ``num_classes``. Later bad masks, and unreadable
        files anywhere, are skipped and counted when read (`SkipCorrupt`), so one bad file among
        thousands cannot stop a long run."""
        pairs = self.pairs
        progress = tqdm(pairs, desc=f"checking {len(pairs)} masks", disable=len(pairs) < 2000, leave=False)
        for image_path, ann_path in progress:
            try:
                image, mask = Image.open(image_path), Image.open(ann_path)
            except UNREADABLE:  # skipped and counted when read (or strict's error)
                continue
            with image, mask:  # the size the image is read at: upright, where EXIF turns it
                check_size(
                    str(ann_path), mask.size[::-1], decoded_size(image, self.decode.exif_transpose)[::-1]
                )
        for _, ann_path in pairs[:labelled]:
            try:
                raw = np.asarray(Image.open(ann_path))
            except UNREADABLE:
                continue
            labels(
                raw,
                self.num_classes,
                self.ignore_index,
                self.reduce_zero_label,
                str(ann_path),
            )

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, ann_path = self.pairs[index]
        image = self.decode(image_path)
        raw = np.asarray(Image.open(ann_path))
        return encode(
            image,
            raw,
            self.num_classes,
            self.ignore_index,
            self.reduce_zero_label,
            self.transform,
            str(ann_path),
        )


def cell_size(cell: Any, exif_transpose: bool) -> tuple[int, int]:
    """``(width, height)`` a Hugging Face image cell is read at (upright, where EXIF turns it), from
    its header alone."""
    source = image_source(cell)
    if isinstance(source, Image.Image):
        return decoded_size(source, exif_transpose)
    with Image.open(source) as image:
        return decoded_size(image, exif_transpose)


def check_size(
    name: str, mask_hw: tuple[int, int], image_hw: tuple[int, int], error: type[Exception] = ValueError
) -> None:
    """A mask must have its image's (height, width) as read (upright by its EXIF orientation, unless
    ``exif_transpose`` is off); ``error`` names the annotation when it has not."""
    if tuple(mask_hw) != tuple(image_hw):
        turned = tuple(mask_hw) == tuple(image_hw)[::-1]
        hint = (
            "; width and height swapped: images are read upright by their EXIF orientation unless "
            "data.init_args.exif_transpose=false: set it to how the masks were drawn"
            if turned
            else ""
        )
        raise error(
            f"annotation {name}: size {mask_hw[0]}x{mask_hw[1]} differs from its image "
            f"({image_hw[0]}x{image_hw[1]}){hint}"
        )


def labels(
    raw: np.ndarray, num_classes: int, ignore_index: int, reduce_zero_label: bool, name: str
) -> torch.Tensor:
    """Raw annotation values -> class indices (``ignore_index`` for unlabelled), checked against ``num_classes``."""
    if raw.ndim != 2:
        raise BadSample(f"annotation {name}: expected a single-channel index PNG, got shape {raw.shape}")
    classes = torch.from_numpy(raw.astype(np.int64))
    if reduce_zero_label:  # as mmseg: 0 (unlabelled) and an ignore_index already there both stay ignored
        unlabelled = (classes == 0) | (classes == ignore_index)
        classes = torch.where(unlabelled, ignore_index, classes - 1)
    bad = (classes != ignore_index) & ((classes < 0) | (classes >= num_classes))
    if bad.any():
        largest = int(classes[bad].max())
        top = largest + (1 if reduce_zero_label else 0)
        raise BadSample(
            f"annotation {name}: label value {top} is above num_classes={num_classes}: set "
            f"model.init_args.num_classes={largest + 1} (data.init_args.num_classes follows it) if the data's "
            "classes are right"
        )
    return classes


def encode(
    image: Image.Image,
    raw: np.ndarray,
    num_classes: int,
    ignore_index: int,
    reduce_zero_label: bool,
    transform: Any,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map raw annotation values to classes, check them, transform image and mask together."""
    classes = labels(raw, num_classes, ignore_index, reduce_zero_label, name)
    check_size(name, tuple(classes.shape), (image.height, image.width), BadSample)
    img, mask = transform(tv_tensors.Image(v2.functional.pil_to_tensor(image)), tv_tensors.Mask(classes))
    return img, mask.as_subclass(torch.Tensor).long()


class ADE20KData(FolderOrHubData):
    """ADE20K (or any dataset in its layout) for `SegmentationTask`.

    Training: random rescale (``scale_range`` of ``img_size``), random ``img_size`` crop (padded
    with ignore), horizontal flip. Evaluation: longer side resized to ``img_size``, padded to a
    square (padding is ignored by the metrics). The mIoU is therefore taken on masks at that
    resolution (nearest-neighbour resized), where mmseg's ADE20K evaluation resizes the logits
    back to each image's original size: close, but not digit for digit the published protocol.
    Exactly one of ``root`` (with ``images/`` and ``annotations/``) and ``hf_dataset`` (e.g.
    ``scene_parse_150``) is set.

    Args:
        image_column, label_column: HF columns.
        train_split, val_split: split folder names (``training``/``validation``).
        num_classes: classes (150).
        ignore_index: label of unlabelled pixels.
        reduce_zero_label: raw 0 is "unlabelled" and classes start at 1 (ADE20K).
        img_size: square crop / evaluation size (the coarsest level need not divide it).
        scale_range: training rescale range.
        batch_size: images per batch.
        **kwargs: `FolderOrHubData`'s (``root``, ``hf_dataset``, ...) and `BaseDataModule`'s settings.
    """

    object_annotations = True  # the masks
    layout = "ADE20K layout"
    square = "ADE20K segmentation"

    def __init__(
        self,
        image_column: str = "image",
        label_column: str = "annotation",
        train_split: str = "training",
        val_split: str = "validation",
        num_classes: int = 150,
        ignore_index: int = 255,
        reduce_zero_label: bool = True,
        img_size: int | Sequence[int] = 512,
        scale_range: Sequence[float] = (0.5, 2.0),
        batch_size: int = 16,
        **kwargs: Any,
    ) -> None:
        super().__init__(img_size=img_size, batch_size=batch_size, **kwargs)
        if self.hparams.root is not None:
            for sub in ("images", "annotations"):
                require_dir(Path(self.hparams.root) / sub / train_split, f"data.root/{sub}/{train_split}")

    def transform(self, training: bool) -> Any:
        hp = self.hparams
        size = hp.img_size
        normalise = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        if not training:
            return self.preprocessing.transforms(mask_fill=hp.ignore_index)
        return v2.Compose(
            [
                v2.ScaleJitter((size, size), scale_range=tuple(hp.scale_range), antialias=True),
                v2.RandomCrop(size, pad_if_needed=True, fill={tv_tensors.Mask: hp.ignore_index, "others": 0}),
                v2.RandomHorizontalFlip(),
                *normalise,
            ]
        )

    def _subset(self, name: str, training: bool) -> Dataset | None:
        hp = self.hparams
        transform = self.transform(training)
        if hp.root is not None:
            images, annotations = Path(hp.root) / "images" / name, Path(hp.root) / "annotations" / name
            if not images.is_dir():
                return None
            require_dir(annotations, f"data.root/annotations/{name}")
            ds = SegmentationFolder(
                images,
                annotations,
                hp.num_classes,
                hp.ignore_index,
                transform,
                hp.reduce_zero_label,
                exif_transpose=hp.exif_transpose,
                high_depth=hp.high_depth,
            )
            return SkipCorrupt(ds, lambda i: str(ds.pairs[i][0]), hp.strict)

        decode = ImageDecoder(
            hp.exif_transpose, hp.high_depth
        )  # one per split: each kind of conversion said once

        def convert(row: dict[str, Any], item: str) -> tuple[torch.Tensor, torch.Tensor]:
            image = decode(image_source(row[hp.image_column]), item)
            raw = np.asarray(row[hp.label_column])
            return encode(image, raw, hp.num_classes, hp.ignore_index, hp.reduce_zero_label, transform, item)

        rows = self.hf_rows(name, (hp.image_column, hp.label_column), convert, images=(hp.image_column,))
        if rows is not None:  # as the folder's check: the first rows' labels and sizes, before training
            split = rows.dataset.split
            for index in range(min(CHECKED_LABELS, len(split))):
                item = f"{rows.dataset.name}[{index}]"
                try:
                    row = split[index]
                    size = cell_size(row[hp.image_column], hp.exif_transpose)
                except UNREADABLE:  # an undecodable image: skipped and counted when read
                    continue
                raw = np.asarray(row[hp.label_column])
                labels(raw, hp.num_classes, hp.ignore_index, hp.reduce_zero_label, item)
                check_size(item, raw.shape[:2], size[::-1])
        return rows

    @property
    def num_classes(self) -> int:
        return int(self.hparams.num_classes)

    @property
    def preprocessing(self) -> Preprocessing:
        """The model's input: the longer side to ``img_size``, padded square with black pixels
        (bottom/right; the mask with ``ignore_index``), then normalised."""
        return self.model_input(pad_fill="black")

    def setup(self, stage: str) -> None:
        hp = self.hparams
        for key, setting, training in (("train", "train_split", True), ("val", "val_split", False)):
            if key not in self.datasets:
                ds = self._subset(hp[setting], training)
                if ds is None:
                    raise self.missing_split(setting, hp[setting], under="images")
                self.datasets[key] = ds
        if stage == "predict" and "predict" not in self.datasets:
            name = hp.predict_split or hp.val_split
            ds = self.datasets["val"] if name == hp.val_split else self._subset(name, False)
            if ds is None:
                raise self.missing_split("predict_split", name, under="images")
            self.use_for_predict(ds, name)
