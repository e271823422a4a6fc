"""`DetectionTask`: COCO mAP against pycocotools (crowd regions included), per-image losses of both heads."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch


def _hand_made_detections():
    t = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    i = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    targets = [
        {"boxes": t([[10, 10, 60, 60], [100, 100, 220, 230], [150, 20, 170, 40]]), "labels": i([1, 2, 3])},
        {"boxes": t([[30, 30, 90, 80], [120, 40, 160, 100]]), "labels": i([1, 1])},
        {"boxes": t([[0, 0, 250, 250]]), "labels": i([2])},
        {"boxes": t([]).reshape(0, 4), "labels": i([])},
    ]
    preds = [
        {
            "boxes": t([[12, 12, 58, 62], [105, 95, 215, 225], [5, 5, 40, 40], [150, 20, 171, 41]]),
            "scores": t([0.9, 0.8, 0.3, 0.6]),
            "labels": i([1, 2, 1, 3]),
        },
        {
            "boxes": t([[32, 28, 88, 85], [31, 31, 89, 79], [200, 200, 240, 240]]),
            "scores": t([0.7, 0.65, 0.5]),
            "labels": i([1, 1, 3]),
        },
        {"boxes": t([]).reshape(0, 4), "scores": t([]), "labels": i([])},
        {"boxes": t([[50, 50, 100, 100]]), "scores": t([0.95]), "labels": i([2])},
    ]
    return targets, preds


def _cocoeval(targets, preds, crowd=()) -> list[float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, anns, dets = [], [], []
    for img_id, (tg, pr) in enumerate(zip(targets, preds, strict=True)):
        images.append({"id": img_id, "height": 256, "width": 256})
        for j, ((x1, y1, x2, y2), c) in enumerate(
            zip(tg["boxes"].tolist(), tg["labels"].tolist(), strict=True)
        ):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": img_id,
                    "category_id": c,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": int((img_id, j) in crowd),
                }
            )
        for (x1, y1, x2, y2), c, s in zip(
            pr["boxes"].tolist(), pr["labels"].tolist(), pr["scores"].tolist(), strict=True
        ):
            dets.append(
                {"image_id": img_id, "category_id": c, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": s}
            )
    gt = COCO()
    gt.dataset = {
        "info": {},
        "images": images,
        "annotations": anns,
        "categories": [{"id": c, "name": str(c)} for c in (1, 2, 3)],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(dets), iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats.tolist()


def test_detection_map_equals_cocoeval() -> None:
    from splitlab.tasks.detection import detection_metrics

    targets, preds = _hand_made_detections()
    metric = detection_metrics()["map"]  # the metric a DetectionTask evaluates with
    metric.update(preds, targets)
    ours = metric.compute()
    stats = _cocoeval(targets, preds)
    for key, index in (("map", 0), ("map_50", 1), ("map_75", 2)):
        assert ours[key].item() == pytest.approx(stats[index], abs=1e-6), key
    assert 0 < ours["map"].item() < 1


def test_detections_on_a_crowd_are_ignored_as_cocoeval_does() -> None:
    """Crowd regions flagged in the targets (as the COCO data gives them): mAP equals pycocotools'
    with iscrowd=1; counting the crowd as an instance, or dropping it, gives other numbers."""
    from splitlab.tasks.detection import coco_truth, detection_metrics, without_crowd

    targets, preds = _hand_made_detections()
    crowd = {(0, 1), (1, 1)}  # the second box of the first two images is a crowd region
    for img, tg in enumerate(targets):
        tg["iscrowd"] = torch.tensor([int((img, j) in crowd) for j in range(len(tg["labels"]))])
        tg["area"] = (tg["boxes"][:, 2] - tg["boxes"][:, 0]) * (tg["boxes"][:, 3] - tg["boxes"][:, 1])
    metric = detection_metrics()["map"]
    metric.update(preds, [coco_truth(t) for t in targets])
    ours = metric.compute()["map"].item()
    assert ours == pytest.approx(_cocoeval(targets, preds, crowd)[0], abs=1e-6)
    assert ours != pytest.approx(_cocoeval(targets, preds)[0], abs=1e-3)
    dropped = [without_crowd(t) for t in targets]
    assert [len(t["labels"]) for t in dropped] == [2, 1, 1, 0] and not any(
        t["iscrowd"].any() for t in dropped
    )


@pytest.mark.parametrize("detector", ["faster_rcnn", "mask_rcnn"])
def test_detection_per_image_loss_and_metrics(tmp_path, detector) -> None:
    from splitlab.data import CocoDetectionData, generate_coco

    root = generate_coco(tmp_path / "coco", image_size=64, train=4, val=2)
    dm = CocoDetectionData(
        root=str(root), img_size=64, masks=detector == "mask_rcnn", batch_size=3, num_workers=0
    )
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    task = tiny_detection_task(detector=detector)
    for stage in ("warm_start", "ppo"):  # RPN proposals, then the layout-independent reference proposals
        task.stage = stage
        outputs, layout = task(images)
        loss = task.per_sample_loss(outputs, targets)
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


def tiny_detection_task(patch_size: int = 8, img_size: int = 64, **kwargs):
    from splitlab.tasks import DetectionTask

    return DetectionTask(
        num_classes=3,
        backbone="vit_tiny_patch16_224",
        backbone_kwargs={
            "img_size": img_size,
            "patch_size": patch_size,
            "embed_dim": 32,
            "depth": 2,
            "num_heads": 2,
        },
        levels=[4 * patch_size, 2 * patch_size, patch_size],
        pyramid_channels=16,
        pyramid_indices=[1],
        anchor_sizes=[8, 16, 32, 64],
        representation_size=32,
        decision_dim=16,
        decision_heads=2,
        **kwargs,
    )


def test_boxes_are_decoded_in_float32_under_bf16_autocast() -> None:
    """The recipes' bf16-mixed: the heads run in float32 on the (bf16) pyramid, so boxes come out as
    they do from the same pyramid without autocast (in bf16 they stepped by 4 px at 1024)."""
    from collections import OrderedDict

    head = tiny_detection_task().head.eval()
    gen = torch.Generator().manual_seed(0)
    features = OrderedDict(
        (str(i), torch.randn(2, 16, 16 >> i, 16 >> i, generator=gen).bfloat16()) for i in range(4)
    )
    outputs = {"features": features, "image_sizes": [(64, 64)] * 2}
    with torch.no_grad():
        plain = head.detect({**outputs, "features": OrderedDict((k, v.float()) for k, v in features.items())})
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = head.detect(outputs)
    assert sum(len(d["boxes"]) for d in plain) > 0
    for got, want in zip(mixed, plain, strict=True):
        assert got["boxes"].dtype == torch.float32 and torch.equal(got["boxes"], want["boxes"])


def test_a_patch_that_is_not_a_power_of_two_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a 12-px patch gives pyramid strides 3-24 px.*patch_size=16"):
        tiny_detection_task(patch_size=12, img_size=96)
