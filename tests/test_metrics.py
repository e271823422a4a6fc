"""Fine-token coverage by hand (segmentation cells, detection boxes and masks) and the ADE20K stuff classes."""

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


def test_object_coverage_of_detection_boxes_and_masks_by_hand() -> None:
    from splitlab.metrics import instance_label_map

    # a 4x4-cell image of 2 px cells; one box over cells (0..1, 0..1), one mask in cell (3, 3)
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [6.0, 6.0, 8.0, 8.0]])
    labels = torch.tensor([2, 1])
    label_map = instance_label_map(boxes, labels, (8, 8))
    assert label_map[:4, :4].eq(2).all() and label_map[6:, 6:].eq(1).all() and label_map.sum() == 2 * 16 + 4
    masks = torch.zeros(2, 8, 8, dtype=torch.uint8)
    masks[0, 0:3, 0:3] = 1  # a mask inside its box: cell (1, 1) is then part object, part background
    masks[1, 6:, 6:] = 1
    from_masks = instance_label_map(boxes, labels, (8, 8), masks)
    assert from_masks[:3, :3].eq(2).all() and from_masks[3, 3] == 0
    levels = Levels((4, 2))
    tokens = [torch.zeros(1, 2, 2, 3), torch.zeros(1, 4, 4, 3)]
    split_top_left = [torch.tensor([[[True, False], [False, False]]])]  # fine tokens on the first box only
    layout = build_layout(tokens, split_top_left, levels)
    metric = FineCoverage(cell=2, ignore_index=-1, background=(0,))
    metric.update(layout, from_masks[None])
    values = metric.compute()
    # object cells: (0,0) (0,1) (1,0) (1,1) of the first mask and (3,3) of the second: 4 of 5 fine
    assert values["object_fine_coverage"].item() == pytest.approx(4 / 5)
    # boundary cells (object and background in one cell): (0,1) (1,0) (1,1); all fine
    assert values["boundary_fine_coverage"].item() == pytest.approx(1.0)


def test_the_ade20k_recipe_names_the_50_stuff_classes() -> None:
    import yaml

    from tests.helpers import REPO

    recipe = yaml.safe_load((REPO / "tasks" / "ade20k.yaml").read_text())["model"]["init_args"]
    stuff = recipe["background_classes"]
    assert len(stuff) == len(set(stuff)) == 50 and all(0 <= c < 150 for c in stuff)
    assert {0, 1, 2, 3} <= set(stuff) and 12 not in stuff  # wall, building, sky, floor; not person
