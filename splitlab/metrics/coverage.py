"""Where the fine tokens go: the share of object, class-boundary and thin-structure cells that get
finest-level tokens.

This is the allocation measure of the paper's object / boundary coverage, for segmentation masks and
for detection boxes or masks (`instance_label_map`); thin-structure coverage (classes such as poles,
wires or the hard scenes' lines, grids and rings, where the paper says a 45% budget misses detail)
is its own column where the task names its thin classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from splitlab.tokenizer import TokenLayout


def cell_classes(
    masks: Tensor, cell: int, ignore_index: int, background: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """Per finest cell: does it hold an object pixel, and is it on a class boundary (>= 2 classes)?

    Args:
        masks: ``(B, H, W)`` class indices.
        cell: finest patch size in pixels.
        ignore_index: label of unlabelled pixels (not a class).
        background: classes that are not objects (e.g. stuff).

    Returns:
        ``(B, H/cell, W/cell)`` bool ``object`` and ``boundary`` maps.
    """
    b, h, w = masks.shape
    cells = (
        masks.reshape(b, h // cell, cell, w // cell, cell)
        .permute(0, 1, 3, 2, 4)
        .reshape(b, h // cell, w // cell, -1)
    )
    valid = cells != ignore_index
    is_object = valid.clone()
    for cls in background:
        is_object &= cells != cls
    big = torch.iinfo(torch.int64).max
    lo = torch.where(valid, cells.long(), big).amin(-1)
    hi = torch.where(valid, cells.long(), -1).amax(-1)
    return is_object.any(-1), valid.any(-1) & (lo != hi)


def instance_label_map(
    boxes: Tensor, labels: Tensor, size: tuple[int, int], masks: Tensor | None = None
) -> Tensor:
    """``(H, W)`` map of one image's instances for `FineCoverage`: 0 background, each instance its
    label (its mask where given, else its box), later instances over earlier ones."""
    out = torch.zeros(size, dtype=torch.long, device=boxes.device)
    for i, (box, label) in enumerate(zip(boxes.round().long().tolist(), labels.tolist(), strict=True)):
        if masks is not None:
            out[masks[i].bool()[: size[0], : size[1]]] = int(label)
        else:
            x0, y0, x1, y1 = box
            out[max(y0, 0) : max(y1, 0), max(x0, 0) : max(x1, 0)] = int(label)
    return out


def thin_cells(masks: Tensor, cell: int, thin: Sequence[int]) -> Tensor:
    """``(B, H/cell, W/cell)`` bool: finest cells holding a pixel of one of the ``thin`` classes."""
    hit = torch.zeros_like(masks, dtype=torch.bool)
    for cls in thin:
        hit |= masks == cls
    b, h, w = masks.shape
    return hit.reshape(b, h // cell, cell, w // cell, cell).any(4).any(2)


class FineCoverage(Metric):
    """Share of object cells, of class-boundary cells and of thin-structure cells that get
    finest-level tokens.

    A finest-grid cell is an *object* cell if any of its pixels belongs to a non-background class,
    a *boundary* cell if its pixels hold at least two classes, a *thin* cell if any of its pixels
    belongs to one of ``thin`` (reported only when ``thin`` is given). SPLIT should spend its fine
    tokens there (the paper: 90.7% of object patches vs APT's 80.8%).

    Args:
        cell: finest patch size in pixels.
        ignore_index: unlabelled pixels.
        background: classes that are not objects.
        thin: classes that are thin structures (lines, wires, rings), for ``thin_fine_coverage``.
    """

    full_state_update = False

    def __init__(
        self,
        cell: int,
        ignore_index: int = 255,
        background: Sequence[int] = (),
        thin: Sequence[int] = (),
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.cell, self.ignore_index, self.background = cell, ignore_index, tuple(background)
        self.thin = tuple(thin)
        states = ("object_fine", "object_total", "boundary_fine", "boundary_total", "labelled")
        for name in (*states, "thin_fine", "thin_total"):
            self.add_state(name, torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, layout: TokenLayout, masks: Tensor) -> None:
        fine = layout.level_map() == layout.levels.num - 1
        if masks.shape[-2:] != (fine.shape[1] * self.cell, fine.shape[2] * self.cell):
            masks = F.interpolate(
                masks[:, None].float(),
                size=(fine.shape[1] * self.cell, fine.shape[2] * self.cell),
                mode="nearest",
            )[:, 0].long()
        self.labelled += (masks != self.ignore_index).sum()
        is_object, boundary = cell_classes(masks, self.cell, self.ignore_index, self.background)
        self.object_fine += (fine & is_object).sum()
        self.object_total += is_object.sum()
        self.boundary_fine += (fine & boundary).sum()
        self.boundary_total += boundary.sum()
        if self.thin:
            thin = thin_cells(masks, self.cell, self.thin)
            self.thin_fine += (fine & thin).sum()
            self.thin_total += thin.sum()

    def compute(self) -> dict[str, Tensor]:
        """Coverage of object, boundary (and, with ``thin``, thin-structure) cells (NaN where there are
        none), and the labelled pixels."""
        nan = torch.tensor(float("nan"), device=self.labelled.device)
        out = {
            "object_fine_coverage": self.object_fine / self.object_total if self.object_total > 0 else nan,
            "boundary_fine_coverage": self.boundary_fine / self.boundary_total
            if self.boundary_total > 0
            else nan,
            "labelled_pixels": self.labelled,
        }
        if self.thin:
            out["thin_fine_coverage"] = self.thin_fine / self.thin_total if self.thin_total > 0 else nan
        return out
