"""`CocoDetectionData`: COCO-format detection (``instances_*.json`` + an image folder) via pycocotools."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from splitlab.data.common import BadSample, BaseDataModule, SkipCorrupt, require_dir
from splitlab.model.images import ImageDecoder
from splitlab.model.preprocess import Preprocessing

IMAGE_FIELDS = ("id", "file_name")
ANNOTATION_FIELDS = ("image_id", "category_id", "bbox")


def check_ids(coco: Any, annotations: Path) -> None:
    """Every image and annotation has the fields splitlab reads, and every annotation names an image
    and a category of the file (checked before training)."""
    for kind, fields in (("images", IMAGE_FIELDS), ("annotations", ANNOTATION_FIELDS)):
        for entry in coco.dataset.get(kind, []):
            lacking = [f for f in fields if f not in entry]
            box = entry.get("bbox", [0] * 4)
            if kind == "annotations" and not (isinstance(box, list) and len(box) == 4):
                lacking.append("bbox as [x, y, width, height]")
            if lacking:
                raise ValueError(
                    f"{annotations}: an entry of {kind!r} lacks {lacking} (COCO's instances format), "
                    f"e.g. {str(entry)[:120]}"
                )
    anns = coco.dataset.get("annotations", [])
    orphans = [a for a in anns if a.get("image_id") not in coco.imgs]
    if orphans:
        raise ValueError(
            f"{annotations}: {len(orphans)} annotation(s) name an image_id that is not among the images, "
            f"e.g. annotation id {orphans[0].get('id')} with image_id {orphans[0].get('image_id')}"
        )
    unknown = [a for a in anns if a.get("category_id") not in coco.cats]
    if unknown:
        raise ValueError(
            f"{annotations}: {len(unknown)} annotation(s) name a category_id that is not among the categories "
            f"{sorted(coco.cats)}, e.g. annotation id {unknown[0].get('id')} with category_id {unknown[0].get('category_id')}"
        )


def load_coco(annotations: Path, images: Path) -> tuple[Any, list[int], dict[int, int], int]:
    """Read and check a COCO instances file.

    Returns the COCO index, image ids, category id -> contiguous label (1..K) and the number of
    annotations dropped (zero area, or a box outside its image: counted in a warning).
    """
    from pycocotools.coco import COCO

    if not annotations.is_file():
        raise FileNotFoundError(f"{annotations}: no such annotation file")
    try:
        doc = json.loads(annotations.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{annotations}: malformed COCO annotations (not JSON: {err})") from err
    if not isinstance(doc, dict):
        raise ValueError(
            f"{annotations}: malformed COCO annotations (not a JSON object with 'images', 'annotations' "
            f"and 'categories' but a {type(doc).__name__})"
        )
    coco = COCO()
    coco.dataset = doc
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco.createIndex()
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{annotations}: malformed COCO annotations ({err})") from err
    check_ids(coco, annotations)
    missing = [
        img["file_name"]
        for img in coco.dataset.get("images", [])
        if not (images / img["file_name"]).is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"{annotations} names {len(missing)} image(s) missing from {images}, e.g. {missing[0]}"
        )
    dropped = 0
    for ann in coco.dataset.get("annotations", []):
        img = coco.imgs[ann["image_id"]]
        if "width" not in img or "height" not in img:  # what boxes and masks are read against
            raise ValueError(f"{annotations}: image {img['id']} has annotations but no width and height")
        x, y, w, h = ann["bbox"]
        # a box reaching past the border is kept (the letterbox clamps it, as COCO's rounding
        # needs); one with no area inside the image cannot be trained on or matched
        inside = x < img["width"] and y < img["height"] and x + w > 0 and y + h > 0
        if w <= 0 or h <= 0 or not inside:
            ann["_splitlab_drop"] = True
            dropped += 1
    if dropped:
        warnings.warn(
            f"{annotations}: dropped {dropped} annotation(s) with zero area or boxes wholly outside the image",
            stacklevel=2,
        )
    categories = {cid: i + 1 for i, cid in enumerate(sorted(coco.cats))}
    return coco, sorted(coco.imgs), categories, dropped


class CocoDetection(Dataset):
    """(image, target) pairs; targets hold boxes (xyxy, input pixels), labels, optional masks,
    the image id and the letterbox scale (to map predictions back to the original image). Images are
    decoded upright by their EXIF orientation unless ``exif_transpose`` is off (`ImageDecoder`)."""

    def __init__(
        self,
        images: Path,
        annotations: Path,
        transform: Any,
        masks: bool,
        img_size: int,
        training: bool = False,
        exif_transpose: bool = True,
        high_depth: str = "range",
    ) -> None:
        self.images, self.transform, self.masks, self.img_size = images, transform, masks, img_size
        self.decode = ImageDecoder(exif_transpose, high_depth)
        self.coco, self.ids, self.categories, self.dropped = load_coco(annotations, images)
        if training:  # the letterbox drops boxes under a pixel at the network's size: say how many
            tiny = sum(self.under_a_pixel(a) for a in self.coco.dataset.get("annotations", []))
            if tiny:
                warnings.warn(
                    f"{annotations}: {tiny} box(es) under a pixel at the network's input size ({img_size} px) are "
                    "left out of training (evaluation keeps them)",
                    stacklevel=2,
                )

    def under_a_pixel(self, ann: dict[str, Any]) -> bool:
        """Whether an annotation's box, clamped to its image and letterboxed, is under a pixel wide or
        high (and not already dropped by `load_coco`)."""
        if ann.get("_splitlab_drop"):
            return False
        img = self.coco.imgs[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        width = min(x + w, img["width"]) - max(x, 0)
        height = min(y + h, img["height"]) - max(y, 0)
        return min(width, height) * self.img_size / max(img["width"], img["height"]) < 1.0

    def check_turned(self, info: dict[str, Any], width: int, height: int) -> None:
        """An image its EXIF orientation turned, whose annotations are on the stored pixels (their
        width and height are the stored image's, swapped): its boxes would lie across the objects."""
        given = (info.get("width"), info.get("height"))
        if self.decode.exif_transpose and width != height and given == (height, width):
            raise BadSample(
                f"{self.images / info['file_name']}: read upright (by its EXIF orientation) it is "
                f"{width}x{height}, its annotations say {given[0]}x{given[1]}: boxes drawn on the stored "
                "pixels of a turned photo need data.init_args.exif_transpose=false (read images as stored)"
            )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        image_id = self.ids[index]
        info = self.coco.imgs[image_id]
        image = self.decode(self.images / info["file_name"])
        self.check_turned(info, image.width, image.height)
        # crowd regions come along, flagged: the loss leaves them out, COCO evaluation ignores
        # detections on them (`splitlab.heads.without_crowd`, `splitlab.metrics.coco_truth`)
        anns = [a for a in self.coco.imgToAnns.get(image_id, []) if not a.get("_splitlab_drop")]
        boxes = torch.tensor(
            [
                [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                for a in anns
            ],
            dtype=torch.float32,
        ).reshape(-1, 4)
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(image.height, image.width)),
            "labels": torch.tensor([self.categories[a["category_id"]] for a in anns], dtype=torch.int64),
            "iscrowd": torch.tensor([int(bool(a.get("iscrowd", 0))) for a in anns], dtype=torch.int64),
            "area": torch.tensor(
                [float(a.get("area", a["bbox"][2] * a["bbox"][3])) for a in anns], dtype=torch.float32
            ),
        }
        if self.masks:
            masks = [torch.from_numpy(self.coco.annToMask(a)) for a in anns]
            target["masks"] = tv_tensors.Mask(
                torch.stack(masks) if masks else torch.zeros(0, image.height, image.width, dtype=torch.uint8)
            )
        img, target = self.transform(tv_tensors.Image(v2.functional.pil_to_tensor(image)), target)
        out = {k: v.as_subclass(torch.Tensor) for k, v in target.items()}
        out["image_id"] = torch.tensor(image_id)
        out["scale"] = torch.tensor(self.img_size / max(image.width, image.height))
        return img.as_subclass(torch.Tensor), out


def collate(
    batch: list[tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Images stacked (all are letterboxed to one size), targets as a list."""
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


def _per_box_fields(inputs: Any) -> tuple[torch.Tensor, ...]:
    """What `SanitizeBoundingBoxes` drops with a degenerate box (masks go by their type)."""
    target = inputs[1]
    return tuple(target[k] for k in ("labels", "iscrowd", "area") if k in target)


def letterbox(preprocessing: Preprocessing, flip: bool) -> Any:
    """The model's letterbox (`Preprocessing`), with boxes clamped to the image; for training
    (``flip``) also a flip first and boxes under a pixel dropped, which the losses cannot use.
    Evaluation keeps every ground-truth box, so the mAP is taken on the annotations as given."""
    pre = [v2.RandomHorizontalFlip()] if flip else []
    post: list[Any] = [v2.ClampBoundingBoxes()]
    if flip:
        post.append(v2.SanitizeBoundingBoxes(min_size=1.0, labels_getter=_per_box_fields))
    return preprocessing.transforms(pre=pre, post=post)


class CocoDetectionData(BaseDataModule):
    """COCO detection for `DetectionTask`: images letterboxed to ``img_size`` (longer side), padded square.

    Args:
        root: dataset root.
        train_images, val_images: image folders under ``root``.
        train_annotations, val_annotations: instances JSON files under ``root``.
        img_size: network input size, square (the coarsest level need not divide it: clipped edge patches).
        masks: load instance masks (Mask R-CNN).
        batch_size: images per batch.
        **kwargs: `BaseDataModule`'s settings (``mean``, ``std``, ``num_workers``, ``exif_transpose``, ...).
    """

    object_annotations = True  # boxes and masks
    square = "COCO detection"

    def __init__(
        self,
        root: str,
        train_images: str = "train2017",
        val_images: str = "val2017",
        train_annotations: str = "annotations/instances_train2017.json",
        val_annotations: str = "annotations/instances_val2017.json",
        img_size: int | Sequence[int] = 1024,
        masks: bool = False,
        batch_size: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(img_size=img_size, batch_size=batch_size, **kwargs)
        require_dir(root, "data.root")

    def _subset(self, images: str, annotations: str, training: bool) -> Dataset:
        hp = self.hparams
        root = Path(hp.root)
        folder = require_dir(root / images, f"data.root/{images}")
        ds = CocoDetection(
            folder,
            root / annotations,
            letterbox(self.preprocessing, training),
            hp.masks,
            hp.img_size,
            training,
            hp.exif_transpose,
            hp.high_depth,
        )
        return SkipCorrupt(ds, lambda i: str(folder / ds.coco.imgs[ds.ids[i]]["file_name"]), hp.strict)

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if "val" not in self.datasets:
            self.datasets["val"] = self._subset(hp.val_images, hp.val_annotations, False)
        if stage == "predict" and "predict" not in self.datasets:
            self.use_for_predict(self.datasets["val"], hp.val_images)
        if stage == "fit" and "train" not in self.datasets:
            self.datasets["train"] = self._subset(hp.train_images, hp.train_annotations, True)
            self._check_same_categories()

    def _check_same_categories(self) -> None:
        """Labels are category ranks in each file: both files must list the same categories, or label
        k would be one class in training and another in evaluation (a silently wrong mAP)."""
        train, val = (self.datasets[key].dataset.coco.cats for key in ("train", "val"))
        names = (
            {cid: c.get("name") for cid, c in train.items()},
            {cid: c.get("name") for cid, c in val.items()},
        )
        if names[0] != names[1]:
            differ = sorted(set(names[0].items()) ^ set(names[1].items()), key=str)[:3]
            raise ValueError(
                f"{Path(self.hparams.root) / self.hparams.train_annotations} and "
                f"{Path(self.hparams.root) / self.hparams.val_annotations} list different categories "
                f"({len(names[0])} vs {len(names[1])}; e.g. {differ}): give both files the same categories"
            )

    collate_fn = staticmethod(collate)

    @property
    def num_classes(self) -> int:
        """Object categories of the training annotations (those of the validation file before ``fit``)."""
        return len(self.category_ids)

    @property
    def category_ids(self) -> list[int]:
        """The COCO category id of labels 1..K (the categories' ranks; 0 is the background)."""
        categories = self.datasets.get("train", self.datasets["val"]).dataset.categories
        return sorted(categories, key=categories.get)

    @property
    def names(self) -> list[str]:
        """The category names of labels 1..K."""
        cats = self.datasets.get("train", self.datasets["val"]).dataset.coco.cats
        return [str(cats[c].get("name", c)) for c in self.category_ids]

    @property
    def preprocessing(self) -> Preprocessing:
        """The model's input: the longer side to ``img_size``, padded square (bottom/right)."""
        return self.model_input()
