"""Dense tasks: the feature pyramid, EVA-02, evaluation against pycocotools and mmseg, bad input."""

from __future__ import annotations

import pytest
import torch

from splitlab.metrics import FineCoverage, cell_classes
from splitlab.tokenizer import Levels, build_layout


def test_fine_coverage_by_hand() -> None:
    masks = torch.zeros(1, 4, 4, dtype=torch.long)  # 2x2 cells of 2 px; class 0 background
    masks[0, 0, 0] = 3  # object pixel in cell (0, 0): object and boundary
    masks[0, 2:, 2:] = 2  # cell (1, 1) all object: object, not boundary
    masks[0, 2, 0] = 255  # ignored pixel in cell (1, 0): still pure background
    is_object, boundary = cell_classes(masks, 2, 255, background=(0,))
    assert is_object.tolist() == [[[True, False], [False, True]]]
    assert boundary.tolist() == [[[True, False], [False, False]]]
    levels = Levels((4, 2))
    tokens = [torch.zeros(1, 1, 1, 3), torch.zeros(1, 2, 2, 3)]
    layout = build_layout(tokens, [torch.ones(1, 1, 1, dtype=torch.bool)], levels)  # all fine
    metric = FineCoverage(cell=2, background=(0,))
    metric.update(layout, masks)
    coarse = build_layout(tokens, [torch.zeros(1, 1, 1, dtype=torch.bool)], levels)
    metric.update(coarse, masks)
    values = metric.compute()
    assert values["object_fine_coverage"].item() == pytest.approx(0.5)
    assert values["boundary_fine_coverage"].item() == pytest.approx(0.5)
