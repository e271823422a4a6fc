"""`ImageClassificationData`: an ImageFolder tree or a Hugging Face dataset, with timm's transforms."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.data import create_transform
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from splitlab.data.common import FolderOrHubData, SkipCorrupt, require_dir
from splitlab.data.hf import image_source
from splitlab.data.objects import WithBoxes, eval_resize, read_objects
from splitlab.model.images import ImageDecoder
from splitlab.model.preprocess import Preprocessing


class ImageClassificationData(FolderOrHubData):
    """Classification data from an ImageFolder tree or a Hugging Face dataset.

    Exactly one of ``root`` (``root/<split>/<class>/<image>``) and ``hf_dataset`` is set. Images get
    timm's transforms: training augmentation (random-resized crop, horizontal flip, ...) unless
    ``augment`` is False. Check that augmentation keeps classes: a flip turns "/" into "\\", a
    crop can cut a small object out.

    Args:
        image_column, label_column: HF columns.
        train_split, val_split, test_split: split (folder) names; test falls back to val.
        img_size: input size (the backbone's): a side, or ``[height, width]`` for a non-square input
            (timm's transforms: evaluation keeps the aspect ratio and crops the centre).
        interpolation, crop_pct: preprocessing (the backbone's pretrained config).
        augment: training augmentation on.
        hflip: horizontal-flip probability of the augmentation.
        scale: random-resized-crop scale range.
        batch_size: images per batch.
        objects: a JSON file (a relative path is under ``root``) of each image's object box,
            ``{split: {path under root: [x0, y0, x1, y1]}}`` (``splitlab data shapes`` writes
            ``objects.json``): batches then carry the boxes (``(images, labels, boxes)``), which the
            ``oracle`` row and ``label_source: annotations`` read. ImageFolder roots without
            augmentation only (a random crop moves the object).
        **kwargs: `FolderOrHubData`'s (``root``, ``hf_dataset``, ...) and `BaseDataModule`'s settings.
    """

    layout = "an ImageFolder tree"

    def __init__(
        self,
        image_column: str = "image",
        label_column: str = "label",
        train_split: str = "train",
        val_split: str = "val",
        test_split: str = "test",
        img_size: int | Sequence[int] = 224,
        interpolation: str = "bicubic",
        crop_pct: float = 0.875,
        augment: bool = True,
        hflip: float = 0.5,
        scale: Sequence[float] = (0.08, 1.0),
        batch_size: int = 64,
        objects: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(img_size=img_size, batch_size=batch_size, **kwargs)
        root = self.hparams.root
        if root is not None:
            require_dir(root, "data.root")
            require_dir(Path(root) / train_split, "data.root/train_split")
        if objects is not None and (root is None or augment):
            why = (
                "a root (its keys are paths under it)"
                if root is None
                else "augment: false (a crop moves them)"
            )
            raise ValueError(f"data.init_args.objects={objects!r}: the boxes need {why}")
        self.boxes = None if objects is None else read_objects(Path(root or "") / Path(objects).expanduser())
        self.classes: list[str] = []

    @property
    def preprocessing(self) -> Preprocessing:
        """The model's input: timm's evaluation transform (resize, centre crop, normalise)."""
        hp = self.hparams
        return self.model_input(resize="crop", interpolation=hp.interpolation, crop_pct=hp.crop_pct)

    @property
    def names(self) -> list[str]:
        """The class names, in label order."""
        return list(self.classes)

    def transform(self, training: bool) -> Any:
        hp = self.hparams
        if not training:
            return self.preprocessing.image_transform
        return create_transform(
            input_size=(3, *self.preprocessing.shape),
            is_training=training,
            no_aug=not hp.augment,
            hflip=hp.hflip,
            scale=tuple(hp.scale),
            interpolation=hp.interpolation,
            mean=self.mean,
            std=self.std,
            crop_pct=hp.crop_pct,
        )

    def _subset(self, name: str, training: bool) -> Dataset | None:
        hp = self.hparams
        transform = self.transform(training)
        decode = ImageDecoder(
            hp.exif_transpose, hp.high_depth
        )  # one per split: each kind of conversion said once
        if hp.root is not None:
            folder = Path(hp.root) / name
            if not folder.is_dir():
                return None
            empty = [
                d.name
                for d in sorted(folder.iterdir())
                if d.is_dir()
                and not any(f.is_file() and f.suffix.lower() in IMG_EXTENSIONS for f in d.rglob("*"))
            ]
            if empty:
                raise ValueError(
                    f"data.root={hp.root!r}: class folder(s) {empty} in {name}/ hold no image files "
                    f"({', '.join(IMG_EXTENSIONS)})"
                )
            boxed = self.boxes is not None
            dataset = ImageFolder(str(folder), transform=None if boxed else transform, loader=decode)
            if self.classes and dataset.classes != self.classes:
                raise ValueError(
                    f"data.root={hp.root!r}: {name}/ has classes {dataset.classes}, train/ has {self.classes}"
                )
            self.classes = self.classes or list(dataset.classes)
            items = self.with_boxes(dataset, transform, name, training) if boxed else dataset
            return SkipCorrupt(items, lambda i, ds=dataset: ds.samples[i][0], hp.strict)
        splits = self.hf_splits()
        if name in splits and not self.classes and hp.label_column in splits[name].column_names:
            names = getattr(splits[name].features[hp.label_column], "names", None)
            # plain integer labels: the classes are 0..max, so the model is checked against them
            if not names:
                top = max(splits[name][hp.label_column], default=-1)
                names = [str(i) for i in range(int(top) + 1)]
            self.classes = list(names)

        def convert(row: dict[str, Any], item: str) -> tuple[torch.Tensor, int]:
            return transform(decode(image_source(row[hp.image_column]), item)), int(row[hp.label_column])

        return self.hf_rows(name, (hp.image_column, hp.label_column), convert, images=(hp.image_column,))

    @property
    def object_annotations(self) -> bool:
        return self.boxes is not None

    def with_boxes(self, dataset: ImageFolder, transform: Any, name: str, training: bool) -> WithBoxes:
        """``dataset``'s items with their object boxes, moved through the transform's resize and crop."""
        hp = self.hparams
        root = Path(hp.root)
        img_size = self.preprocessing.img_size  # a side, or (height, width) of a non-square input
        # timm's training transform without augmentation resizes to (height, width) exactly (a square
        # too: it squashes); its evaluation keeps the aspect ratio (the shorter side, for a square)
        resize = self.preprocessing.shape if training else eval_resize(img_size, hp.crop_pct)
        boxes = WithBoxes(
            dataset,
            transform,
            lambda i: Path(dataset.samples[i][0]).relative_to(root).as_posix(),
            self.boxes.get(name, {}),
            resize,
            img_size,
            keep_ratio=not training,
        )
        missing = boxes.missing()
        if missing:
            rank_zero_info(f"splitlab: data.objects gives no box for {missing} of {len(boxes)} {name} images")
        return boxes

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if "train" not in self.datasets:
            train = self._subset(hp.train_split, training=True)
            if train is None:
                raise self.missing_split("train_split", hp.train_split)
            self.datasets["train"] = train
        if "val" not in self.datasets:
            val = self._subset(hp.val_split, training=False)
            if val is None:
                raise self.missing_split("val_split", hp.val_split)
            self.datasets["val"] = val
        if stage == "test" and "test" not in self.datasets:
            self._check_labelled(hp.test_split)
            self.datasets["test"] = self._subset(hp.test_split, training=False) or self.datasets["val"]
        if stage == "predict" and "predict" not in self.datasets:
            self.use_for_predict(*self._predict_split())

    def _predict_split(self) -> tuple[Dataset, str]:
        """The split predict reads: ``predict_split`` (refused if missing), else the test split where
        there is one, else the validation split."""
        hp = self.hparams
        if hp.predict_split is not None:
            dataset = self._subset(hp.predict_split, training=False)
            if dataset is None:
                raise self.missing_split("predict_split", hp.predict_split)
            return dataset, hp.predict_split
        dataset = self._subset(hp.test_split, training=False)
        return (dataset, hp.test_split) if dataset is not None else (self.datasets["val"], hp.val_split)

    def _check_labelled(self, name: str) -> None:
        """Refuse to test on a split without labels (ImageNet-1k's ``test``: every label -1) before
        any work, instead of a cross-entropy error about target -1 mid-run."""
        hp = self.hparams
        if hp.root is not None or name not in self.hf_splits():
            return
        lowest = min(self.hf_splits()[name][hp.label_column], default=0)
        if lowest < 0:
            raise ValueError(
                f"data.test_split={name!r} of {hp.hf_dataset!r} has no labels ({hp.label_column} = {lowest}): "
                "test on a labelled split, e.g. --data.init_args.test_split=validation (predict needs none)"
            )

    test_key = "test"  # setup falls back to the validation split when there is no test folder

    @property
    def num_classes(self) -> int:
        return len(self.classes)
