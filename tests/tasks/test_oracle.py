"""The ``oracle`` row and ``label_source: annotations``: each task's annotated cells are the cells its
coverage metric counts, the oracle layout puts finest tokens on all of them when the budget buys
them, and a setting that needs annotations the data lacks is refused before training."""

from __future__ import annotations

import pytest
import torch

from splitlab.metrics import cell_classes
from tests.tasks.test_detection import tiny_detection_task


def test_the_detection_oracle_covers_every_object_cell_and_meets_the_budget(tmp_path) -> None:
    from splitlab.data import CocoDetectionData, generate_coco

    root = generate_coco(tmp_path / "coco", img_size=64, train=4, val=2)
    dm = CocoDetectionData(root=str(root), img_size=64, batch_size=4, num_workers=0)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    task = tiny_detection_task(evaluation={"eval_baselines": ["uniform", "oracle"]})
    cells = task.annotated_cells(batch, (8, 8))
    metrics = task.build_metrics()
    with torch.no_grad():
        layout = task.comparison.oracle_layout(batch[0], batch, 0.6, seed=0)
        task.update_metrics(metrics, task.forward_layout(layout), batch[1], layout)
    assert cells.shape == (4, 8, 8) and 0 < cells.float().mean() < 0.6  # objects, with room to spare
    assert layout.fraction.mean().item() == pytest.approx(0.6, abs=0.03)
    assert metrics.compute()["object_fine_coverage"].item() == 1.0  # every object cell at the finest level
    fine = layout.level_map() == layout.levels.num - 1
    assert fine[cells].all() and not fine.all()


def test_segmentation_marks_object_and_boundary_cells() -> None:
    from splitlab.tasks import SegmentationTask
    from tests.tasks.test_segmentation import TINY

    size = {**TINY["backbone_kwargs"], "img_size": 64}
    task = SegmentationTask(num_classes=5, background_classes=[0, 1], **{**TINY, "backbone_kwargs": size})
    masks = torch.zeros(2, 64, 64, dtype=torch.long)
    masks[:, 32:] = 1  # a stuff boundary along row 32: no cell holds two classes
    masks[0, 4:12, 4:12] = 3  # an object over parts of four cells
    masks[1, 30:34] = 255  # unlabelled pixels hold no class
    cells = task.annotated_cells((torch.zeros(2, 3, 64, 64), masks), (8, 8))
    is_object, boundary = cell_classes(masks, 8, 255, (0, 1))
    assert torch.equal(cells, is_object | boundary)
    assert cells[0, 0:2, 0:2].all() and cells[0].sum() == 4 and cells[1].sum() == 0


def test_classification_marks_the_cells_its_box_touches() -> None:
    from splitlab.tasks import ClassificationTask
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, **TINY)
    boxes = torch.tensor([[9.0, 0.0, 17.0, 8.0], [0.0, 0.0, 0.0, 0.0]])  # cells (0,1)-(0,2); no box
    cells = task.annotated_cells((torch.zeros(2, 3, 64, 64), torch.zeros(2), boxes), (8, 8))
    assert cells[0].nonzero().tolist() == [[0, 1], [0, 2]] and not cells[1].any()
    assert task.annotated_cells((torch.zeros(2, 3, 64, 64), torch.zeros(2)), (8, 8)) is None


def test_annotations_the_data_lacks_are_refused_before_training(shapes_root, tmp_path) -> None:
    """The classification twin imitates the oracle and shows its row: without the object boxes, one line."""
    from tests.helpers import fit

    said = "warm_start.label_source=annotations and model.init_args.evaluation.eval_baselines with oracle need annotations .* data.init_args.objects"
    with pytest.raises(ValueError, match=said):
        fit(shapes_root, tmp_path, "--data.init_args.objects=null")
