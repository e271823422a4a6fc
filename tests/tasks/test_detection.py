"""`DetectionTask`: per-image losses of both heads, its metrics (mAP and fine coverage of the objects)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("detector", ["faster_rcnn", "mask_rcnn"])
def test_detection_per_image_loss_and_metrics(tmp_path, detector) -> None:
    from splitlab.data import CocoDetectionData, generate_coco

    root = generate_coco(tmp_path / "coco", img_size=64, train=4, val=2)
    dm = CocoDetectionData(
        root=str(root), img_size=64, masks=detector == "mask_rcnn", batch_size=3, num_workers=0
    )
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    task = tiny_detection_task(detector={"name": detector})
    for stage in ("warm_start", "ppo"):  # RPN proposals, then the layout-independent reference proposals
        task.algorithm.progress.enter(stage)
        outputs, layout = task(images)
        loss = task.per_image_loss(outputs, targets)
        assert loss.shape == (3,) and torch.isfinite(loss).all()
    loss.mean().backward()
    assert task.head.pyramid.outputs[0][0].weight.grad is not None
    metrics = task.build_metrics()
    with torch.no_grad():
        outputs, layout = task(images)
        task.update_metrics(metrics, outputs, targets, layout)
    values = metrics.compute()
    assert {"map", "map_50", "object_fine_coverage", "boundary_fine_coverage"} <= set(values)
    # the object coverage is the share of object cells (under a box) that got finest tokens
    from splitlab.metrics import instance_label_map

    fine = layout.level_map() == layout.levels.num - 1
    cells = torch.stack([instance_label_map(t["boxes"], t["labels"], (64, 64)) for t in targets])
    is_object = cells.view(3, 8, 8, 8, 8).permute(0, 1, 3, 2, 4).reshape(3, 8, 8, -1).gt(0).any(-1)
    expected = (fine & is_object).sum() / is_object.sum()
    assert values["object_fine_coverage"].item() == pytest.approx(expected.item(), abs=1e-6)


def tiny_detection_task(patch_size: int = 8, img_size: int = 64, detector: dict | None = None, **kwargs):
    from splitlab.tasks import DetectionTask

    return DetectionTask(
        detector={"anchor_sizes": [8, 16, 32, 64], "representation_size": 32, **(detector or {})},
        num_classes=3,
        backbone="vit_tiny_patch16_224",
        backbone_kwargs={
            "img_size": img_size,
            "patch_size": patch_size,
            "embed_dim": 32,
            "depth": 2,
            "num_heads": 2,
        },
        tokenizer={
            "levels": [4 * patch_size, 2 * patch_size, patch_size],
            "decision_dim": 16,
            "decision_heads": 2,
        },
        pyramid_channels=16,
        pyramid_indices=[1],
        **kwargs,
    )


def test_a_patch_that_is_not_a_power_of_two_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a 12-px patch gives pyramid strides 3-24 px.*patch_size=16"):
        tiny_detection_task(patch_size=12, img_size=96)


def test_a_detectors_own_targets_are_its_confident_detections_with_their_masks_pasted(tmp_path) -> None:
    """``label_source: fidelity`` on detection: the finest grid's detections scoring at least 0.5 are
    the instances the loss reads (Mask R-CNN: their masks pasted at the data's size); the labels run."""
    from splitlab.data import CocoDetectionData, generate_coco
    from splitlab.tasks.detection import OWN_SCORE
    from splitlab.tokenizer import fraction_of

    root = generate_coco(tmp_path / "coco", img_size=64, train=4, val=2)
    dm = CocoDetectionData(root=str(root), img_size=64, masks=True, batch_size=2, num_workers=0)
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    task = tiny_detection_task(detector={"name": "mask_rcnn"}, warm_start={"label_source": "fidelity"}).eval()
    mask = torch.zeros(1, 28, 28)
    mask[:, 7:21, 7:21] = 1.0
    found = {
        "boxes": torch.tensor([[8.0, 8.0, 40.0, 40.0], [0.0, 0.0, 10.0, 10.0]]),
        "scores": torch.tensor([0.9, OWN_SCORE - 0.1]),
        "labels": torch.tensor([2, 1]),
        "masks": torch.stack([mask, mask]),
    }
    task.head.detect = lambda outputs: [found, {k: v[:0] for k, v in found.items()}]
    own = task.logic.own_targets({}, targets)
    assert own[0]["labels"].tolist() == [2] and own[0]["boxes"].tolist() == [[8.0, 8.0, 40.0, 40.0]]
    assert own[0]["masks"].shape == (1, 64, 64) and bool(own[0]["masks"][0, 24, 24])
    assert not own[0]["masks"][0, 2, 2] and own[1]["boxes"].shape == (0, 4)
    assert torch.equal(own[0]["image_id"], targets[0]["image_id"])
    del task.head.detect  # the detector's own: its real detections are the targets
    labels = task.algorithm.imitation_labels(images, (images, targets), 0.5)
    assert fraction_of(labels, (8, 8)).mean().item() == pytest.approx(0.5, abs=0.05)
