"""Predictions of a `SplitModel` on files, PIL images or tensors: decoded (by the readers' own
decoder, `splitlab.model.images`) and preprocessed in DataLoader workers, batched through the
deployed path, mapped back to each input's own pixels."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2.functional import to_pil_image

from splitlab.model.images import ImageDecoder
from splitlab.model.preprocess import Placement, Preprocessing

# PIL's errors for a file that is not a readable image (a decompression bomb is one too large to trust)
UNREADABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def image_files(paths: Sequence[str | Path]) -> list[Path]:
    """Files given, and inside folders (recursively, sorted) every file with an extension PIL opens;
    a path that does not exist is an error naming it. A symbolic link that leads to no file (one
    that loops, or dangles) is kept, so that reading it skips it with a warning and the count says
    so, as any other unreadable input (dropped here, nothing would)."""
    extensions = {ext.lower() for ext in Image.registered_extensions()}
    found: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            found += sorted(
                p
                for p in path.rglob("*")
                if (p.is_file() or (p.is_symlink() and not p.is_dir()))
                and p.suffix.lower() in extensions
                and not p.name.startswith(".")
            )
        elif path.is_file() or path.is_symlink():
            found.append(path)
        else:
            raise FileNotFoundError(f"input {str(given)!r}: no such file or folder")
    return found


def as_image(item: Any, decode: ImageDecoder | None = None, name: str | None = None) -> Image.Image:
    """A file path, PIL image or ``(C, H, W)`` tensor (uint8, or float in [0, 1]) as an 8-bit RGB
    image, decoded as the data modules decode files (``decode``: default, EXIF orientation applied)."""
    decode = decode or ImageDecoder()
    if isinstance(item, str | Path | Image.Image):
        return decode(item, name)
    if isinstance(item, Tensor):
        if item.dim() != 3:
            raise ValueError(f"an image tensor is (C, H, W), got shape {tuple(item.shape)}")
        if item.is_floating_point():
            item = (item.clamp(0, 1) * 255).round().to(torch.uint8)
        return decode(to_pil_image(item.cpu()), name)
    raise TypeError(f"cannot read an image from {type(item).__name__}: give a path, a PIL image or a tensor")


def describe(item: Any, index: int) -> str:
    """What to call an input in results and messages."""
    return str(item) if isinstance(item, str | Path) else f"input[{index}]"


class InputImages(Dataset):
    """Inputs decoded and preprocessed one by one; an unreadable one is ``(index, None, reason)``.

    Args:
        items: paths, PIL images or tensors.
        preprocessing: the model's.
        exif_transpose: apply EXIF orientations (default: as ``preprocessing`` says, i.e. as the
            model's data module read its files).
        high_depth: ``range`` or ``dtype``: how 16-bit, 32-bit and float images become 8 bits
            (default: as ``preprocessing`` says; `splitlab.model.images`).
    """

    def __init__(
        self,
        items: Sequence[Any],
        preprocessing: Preprocessing,
        exif_transpose: bool | None = None,
        high_depth: str | None = None,
    ) -> None:
        self.items, self.preprocessing = list(items), preprocessing
        upright = preprocessing.exif_transpose if exif_transpose is None else exif_transpose
        depth = preprocessing.high_depth if high_depth is None else high_depth
        self.decode = ImageDecoder(upright, depth)  # one per run: each kind of conversion said once

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, Any, Any]:
        item = self.items[index]
        try:
            name = getattr(item, "filename", "") or describe(item, index)  # a PIL image's own file
            image = as_image(item, self.decode, name)
        except UNREADABLE as err:
            return index, None, f"not a readable image ({err})"
        return index, *self.preprocessing.from_rgb(image)


def collate(batch: list[tuple[int, Any, Any]]) -> tuple[list[int], Tensor | None, list[Placement], list]:
    """The readable inputs stacked, their placements, and the unreadable ones with the reason."""
    kept = [b for b in batch if b[1] is not None]
    images = torch.stack([b[1] for b in kept]) if kept else None
    return [b[0] for b in kept], images, [b[2] for b in kept], [(b[0], b[2]) for b in batch if b[1] is None]


@dataclass
class Prediction:
    """One input's prediction: ``result`` (None when the input was skipped, ``skipped`` says why)."""

    index: int
    source: str
    result: dict[str, Any] | None
    skipped: str | None = None
    image: Tensor | None = None  # the network input, when asked for (token-map pictures)
    layout_boxes: list[list[int]] | None = None


def questions_for(questions: Any, items: Sequence[Any], indices: Sequence[int]) -> list[list[str]] | None:
    """Each image's questions: one list for every image, or one list per input (in input order)."""
    if questions is None:
        return None
    if isinstance(questions, str):
        return [[questions] for _ in indices]
    questions = list(questions)
    if questions and all(isinstance(q, str) for q in questions):
        return [list(questions) for _ in indices]
    if len(questions) != len(items):
        raise ValueError(f"questions: give one list for every image or one list per input ({len(items)})")
    return [list(questions[i]) for i in indices]


@dataclass(frozen=True)
class RunOptions:
    """How one prediction run calls the model (see `predict`)."""

    budget: float | None = None
    max_fraction: float | None = None
    policy: str | None = None
    questions: Any = None
    top_k: int = 5
    return_layout: bool = False
    keep_images: bool = False
    exif_transpose: bool | None = None
    high_depth: str | None = None


def as_items(inputs: Any) -> list[Any]:
    """One input or a sequence of them (a ``(B, C, H, W)`` tensor is B inputs)."""
    if isinstance(inputs, Tensor):
        return list(inputs) if inputs.dim() == 4 else [inputs]
    return [inputs] if isinstance(inputs, str | Path | Image.Image) else list(inputs)


def iter_predictions(
    model: Any, inputs: Any, batch_size: int = 32, num_workers: int = 0, **options: Any
) -> Iterator[Prediction]:
    """Predictions in input order, batch by batch (see `predict`); skipped inputs come with the reason.
    The call is checked here, at once (budget, cap, policy: `SplitModel.check_call`), before any image
    is decoded or a caller opens its outputs; the predictions come as the iterator is read."""
    items = as_items(inputs)
    run = RunOptions(**options)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be at least 1")
    model.check_call(run.budget, run.max_fraction, run.policy)
    return _predictions(model, items, run, batch_size, num_workers)


@torch.inference_mode()
def _predictions(
    model: Any, items: list[Any], run: RunOptions, batch_size: int, num_workers: int
) -> Iterator[Prediction]:
    loader = DataLoader(
        InputImages(items, model.preprocessing, run.exif_transpose, run.high_depth),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate,
    )
    device = next(model.parameters()).device
    for indices, images, placements, unreadable in loader:
        done = {i: Prediction(i, describe(items[i], i), None, skipped=reason) for i, reason in unreadable}
        if images is not None:
            batch = predict_batch(model, items, indices, images.to(device), placements, run)
            done.update((p.index, p) for p in batch)
        yield from (done[i] for i in sorted(done))


def predict_batch(
    model: Any,
    items: Sequence[Any],
    indices: Sequence[int],
    images: Tensor,
    placements: Sequence[Placement],
    run: RunOptions,
) -> list[Prediction]:
    """One batch through the deployed path, and its results."""
    outputs, layout = model(images, budget=run.budget, max_fraction=run.max_fraction, policy=run.policy)
    extra = {"questions": questions_for(run.questions, items, indices)} if model.task == "vqa" else {}
    results = model.results(outputs, placements, top_k=run.top_k, **extra)
    # token boxes in network-input pixels, with their level; fractions in one host read
    boxes = layout.token_boxes() if run.return_layout or run.keep_images else None
    fractions = layout.fraction.tolist()
    out = []
    for row, (index, result) in enumerate(zip(indices, results, strict=True)):
        result = {"tokens": int(layout.seqlens[row]), "token_fraction": fractions[row], **result}
        tokens = None if boxes is None else boxes[row]
        if run.return_layout:
            result["layout"] = tokens
        image = images[row] if run.keep_images else None
        out.append(Prediction(index, describe(items[index], index), result, image=image, layout_boxes=tokens))
    return out


# A mean token fraction is said to miss its budget when it is further from it than both of these:
BUDGET_TOLERANCE = 0.02  # a miss this small does not matter, however many images show it
BUDGET_ERRORS = 2.0  # a miss within this many standard errors may be these images' chance


def mean_and_error(fractions: Sequence[float]) -> tuple[float, float]:
    """The mean of per-image token fractions and its standard error (sample standard deviation over
    the root of the count; NaN for fewer than two images)."""
    count = len(fractions)
    if count == 0:
        return float("nan"), float("nan")
    mean = sum(fractions) / count
    if count < 2:
        return mean, float("nan")
    variance = sum((f - mean) ** 2 for f in fractions) / (count - 1)
    return mean, math.sqrt(variance / count)


def budget_note(
    model: Any, fractions: Sequence[float], budget: float | None, policy: str | None
) -> str | None:
    """What to say when the images' mean token fraction misses the budget by more than
    `BUDGET_TOLERANCE` and by more than `BUDGET_ERRORS` standard errors (None otherwise: one image,
    or a few whose mean may be off by chance, say nothing). The deployed cut was calibrated on the
    training images; on images of another kind it buys another fraction (the demo model, budget 0.5,
    on real photographs: 0.531; README). The uniform grid has no budget to miss."""
    policy = model.check_policy(policy)
    budget = model.budget if budget is None else float(budget)
    if policy == "uniform" or not fractions:
        return None
    mean, error = mean_and_error(fractions)
    calibrated = model.calibration if abs(model.calibration.get("budget", -1) - budget) < 1e-9 else {}
    # the cut itself was fitted on a sample: its mean is uncertain by the calibration's standard error
    cut_error = float(calibrated.get("error") or 0.0)
    both = (error**2 + cut_error**2) ** 0.5
    miss = abs(mean - budget)
    if miss <= BUDGET_TOLERANCE or not miss > BUDGET_ERRORS * both:
        return None
    errors = f", {miss / both:.0f} standard errors" if both > 0 else ""
    counted = f" with the calibration's ± {cut_error:.3f}" if cut_error else ""
    return (
        f"the mean token fraction of these {len(fractions)} image(s) is {mean:.3f} ± {error:.3f} (standard "
        f"error{counted}), for a budget of {budget:g}: {miss:.3f} off{errors}. Its cut was calibrated on other images "
        "(the training images, or those it was last calibrated on), and these differ; `splitlab calibrate "
        "MODEL IMAGES --out DIR` re-fits it on images like these (max_fraction / --max-fraction bounds "
        "every image)"
    )


def predict(model: Any, inputs: Any, **options: Any) -> list[dict[str, Any]]:
    """One result per input, in order: file paths, PIL images or ``(C, H, W)`` / ``(B, C, H, W)``
    tensors, each resized as the model's preprocessing says and its outputs mapped back to its own
    pixels.

    Args:
        model: a `SplitModel`.
        inputs: one input or a sequence of them.
        budget: token budget (default: the model's).
        max_fraction: a hard per-image cap on the token fraction (default: the model's).
        policy: ``learned | uniform | entropy | random`` (default: the trained one).
        batch_size: images per forward pass.
        num_workers: DataLoader workers decoding and preprocessing.
        questions: VQA: one list of questions for every image, or one list per input.
        top_k: classification: classes per result.
        return_layout: add each image's token boxes and levels.
        exif_transpose: apply each file's EXIF orientation, as phones' portrait photos need (default:
            as the model's data was read, ``data.exif_transpose``, on unless trained with it off).
            Every input is decoded as the data modules decode files (`splitlab.model.images`):
            16-bit and float images as ``high_depth`` says, alpha and later frames dropped, said
            once per run.
        high_depth: ``range`` (each 16-bit, 32-bit or float image by its own minimum and maximum)
            or ``dtype`` (by its type's range, so that an 8-bit file and its 16-bit twin read alike);
            default: as the model's data was read (``data.high_depth``, ``range`` unless set).

    Returns:
        per input: ``tokens``, ``token_fraction`` and the task's fields (classification ``class``,
        ``probability``, ``top_k``; detection ``boxes`` xyxy in the input's pixels, ``scores``,
        ``labels``, ``category_ids``, ``names``; segmentation ``mask`` (H, W); VQA ``answers``).
        An unreadable input gives ``{"source": ..., "skipped": reason}`` with a warning. A mean
        token fraction further from the budget than both 0.02 and two standard errors is warned
        about, with its standard error (`budget_note`).
    """
    out: list[dict[str, Any]] = []
    for prediction in iter_predictions(model, inputs, **options):
        if prediction.result is None:
            warnings.warn(f"skipping {prediction.source}: {prediction.skipped}", stacklevel=2)
            out.append({"source": prediction.source, "skipped": prediction.skipped})
        else:
            out.append(prediction.result)
    fractions = [r["token_fraction"] for r in out if "token_fraction" in r]
    note = budget_note(model, fractions, options.get("budget"), options.get("policy"))
    if note:
        warnings.warn(note, stacklevel=3)  # the caller of model.predict
    return out
