"""Dense tasks: the feature pyramid, EVA-02, evaluation against pycocotools and mmseg, bad input."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from conftest import layout_of
from PIL import Image

from splitlab.backbone import PackedViT
from splitlab.tasks.dense import (
    SimpleFeaturePyramid,
    check_pyramid_grid,
    grid_from_dense,
    pyramid_grids,
    pyramid_scales,
)
from splitlab.tasks.metrics import FineCoverage, cell_classes
from splitlab.tokenizer import Levels, SplitTokenizer, build_layout


def test_pyramid_of_a_uniform_layout_equals_the_dense_model() -> None:
    backbone = PackedViT("vit_tiny_patch16_224", img_size=128, depth=4).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (64, 32, 16)).eval()
    pyramid = SimpleFeaturePyramid(backbone.embed_dim, 32, num_inputs=4, scales=pyramid_scales(16)).eval()
    x = torch.randn(3, 3, 128, 128)
    with torch.no_grad():
        features = backbone(layout_of("uniform", tokenizer, backbone, x), indices=[0, 1, 2, 3])
        packed = pyramid(pyramid_grids(features))
        _, dense = backbone.model.forward_intermediates(
            x, indices=[0, 1, 2, 3], norm=False, output_fmt="NCHW"
        )
        reference = pyramid(dense)
    assert [tuple(v.shape[-2:]) for v in packed.values()] == [
        (32, 32),
        (16, 16),
        (8, 8),
        (4, 4),
    ]  # strides 4..32
    for key in packed:
        assert (packed[key] - reference[key]).abs().max().item() <= 1e-4


def test_all_coarse_grid_is_constant_over_each_coarse_cell() -> None:
    backbone = PackedViT("vit_tiny_patch16_224", img_size=128, depth=2).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (64, 32, 16)).eval()
    with torch.no_grad():
        features = backbone(layout_of("coarse", tokenizer, backbone, torch.randn(2, 3, 128, 128)), indices=1)
    grid = pyramid_grids(features)[0]  # (B, D, 8, 8); coarse cells are 4x4
    cells = grid.reshape(2, -1, 2, 4, 2, 4)
    assert torch.equal(cells, cells[:, :, :, :1, :, :1].expand_as(cells))
    assert not torch.equal(cells[:, :, 0, 0], cells[:, :, 1, 1])  # different cells differ


def test_pyramid_strides_and_refusals() -> None:
    assert pyramid_scales(16) == (4.0, 2.0, 1.0, 0.5)
    assert pyramid_scales(8) == (2.0, 1.0, 0.5, 0.25)
    assert pyramid_scales(14) == (4.0, 2.0, 1.0, 0.5)  # strides 3.5 .. 28
    with pytest.raises(ValueError, match="image size 120x120 gives a 15x15 patch grid"):
        check_pyramid_grid((120, 120), 8, pyramid_scales(8))
    check_pyramid_grid((128, 128), 8, pyramid_scales(8))


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("eva02_tiny_patch14_224", {"img_size": 112, "depth": 2}),
        ("eva02_base_patch16_clip_224", {"img_size": 128, "depth": 2}),
        ("eva02_small_patch14_224", {"img_size": 112, "depth": 2, "num_classes": 10}),
    ],
)
def test_eva02_packed_batch_equals_each_image_alone(name, kwargs) -> None:
    backbone = PackedViT(name, **kwargs).eval()
    tokenizer = SplitTokenizer(
        backbone.embed_dim, Levels.default(backbone.patch_size, backbone.img_size)
    ).eval()
    x = torch.randn(3, 3, *backbone.img_size)
    with torch.no_grad():
        mixed = layout_of(
            "random", tokenizer, backbone, x, fraction=0.5, generator=torch.Generator().manual_seed(0)
        )
        batch = backbone(mixed).per_image()
        assert len(set(mixed.seqlens)) > 1
        for i in range(3):
            labels = [d[i : i + 1] for d in mixed.decisions]
            alone = backbone(tokenizer(x[i : i + 1], backbone, mode="labels", labels=labels))
            assert (alone.per_image()[0] - batch[i]).abs().max().item() <= 1e-4


def test_dense_grid_helper() -> None:
    x = torch.arange(2 * 5 * 3, dtype=torch.float).view(2, 5, 3)  # 1 prefix + 2x2 grid
    grid = grid_from_dense(x, 1, (2, 2))
    assert grid.shape == (2, 3, 2, 2) and torch.equal(grid[0, :, 0, 1], x[0, 2])


# ------------------------------------------------------------------ evaluation against references
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


def _cocoeval(targets, preds) -> list[float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, anns, dets = [], [], []
    for img_id, (tg, pr) in enumerate(zip(targets, preds, strict=True)):
        images.append({"id": img_id, "height": 256, "width": 256})
        for (x1, y1, x2, y2), c in zip(tg["boxes"].tolist(), tg["labels"].tolist(), strict=True):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": img_id,
                    "category_id": c,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
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


def test_segmentation_miou_equals_mmseg_iou_metric() -> None:
    from torchmetrics.classification import MulticlassJaccardIndex

    from splitlab.tasks.mmseg_compat import iou_metric_class

    gen = torch.Generator().manual_seed(0)
    classes, ignore = 6, 255
    ours = MulticlassJaccardIndex(
        classes, ignore_index=ignore, average="macro"
    )  # as SegmentationTask builds it
    reference = iou_metric_class()(iou_metrics=["mIoU"], ignore_index=ignore)
    reference.dataset_meta = {"classes": [str(c) for c in range(classes)]}
    for _ in range(3):
        target = torch.randint(0, classes - 1, (2, 32, 32), generator=gen)  # class 5 never appears
        target[:, :4] = ignore
        pred = torch.where(
            torch.rand(2, 32, 32, generator=gen) < 0.7,
            target,
            torch.randint(0, classes, (2, 32, 32), generator=gen),
        )
        pred = torch.where(pred == ignore, 0, pred)
        ours.update(pred, target)
        reference.process(
            {},
            [
                {"pred_sem_seg": {"data": p[None]}, "gt_sem_seg": {"data": t[None]}}
                for p, t in zip(pred, target, strict=True)
            ],
        )
    with contextlib.redirect_stdout(io.StringIO()):
        expected = reference.compute_metrics(reference.results)["mIoU"] / 100
    assert ours.compute().item() == pytest.approx(expected, abs=1e-4)


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


# ------------------------------------------------------------------ bad input
def test_coco_json_naming_missing_images(tmp_path) -> None:
    from splitlab.data import generate_coco
    from splitlab.data.detection import load_coco

    root = generate_coco(tmp_path / "coco", image_size=64, train=3, val=2)
    (root / "val2017" / "000000000001.png").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"instances_val2017.json names 1 image\(s\) missing from .*val2017, e.g. 000000000001.png",
    ):
        load_coco(root / "annotations" / "instances_val2017.json", root / "val2017")


def test_bad_boxes_are_dropped_with_a_counted_warning(tmp_path) -> None:
    from splitlab.data import generate_coco
    from splitlab.data.detection import CocoDetection, _Letterbox

    root = generate_coco(tmp_path / "coco", image_size=64, train=2, val=2)
    path = root / "annotations" / "instances_val2017.json"
    doc = json.loads(path.read_text())
    doc["annotations"][0]["bbox"] = [10, 10, 0, 5]  # zero area
    doc["annotations"][1]["bbox"] = [50, 50, 30, 30]  # beyond a 64 px image
    path.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="dropped 2 annotation"):
        ds = CocoDetection(root / "val2017", path, _Letterbox(64, (0.5,) * 3, (0.5,) * 3, False), masks=True)
    image, target = ds[0]
    assert (
        image.shape == (3, 64, 64)
        and target["boxes"].shape[0] == target["labels"].shape[0] == target["masks"].shape[0]
    )
    with pytest.raises(ValueError, match="malformed COCO annotations"):
        path.write_text(json.dumps({"images": [{"id": 1}], "annotations": [{"image_id": 1}]}))
        CocoDetection(root / "val2017", path, _Letterbox(64, (0.5,) * 3, (0.5,) * 3, False), masks=False)


def test_annotation_labels_above_num_classes(tmp_path) -> None:
    from splitlab.data import ADE20KData, generate_ade20k

    root = generate_ade20k(tmp_path / "ade", image_size=64, train=2, val=2)
    bad = sorted((root / "annotations" / "training").glob("*.png"))[0]
    labels = np.asarray(Image.open(bad)).copy()
    labels[0, 0] = 9
    Image.fromarray(labels).save(bad)
    dm = ADE20KData(root=str(root), num_classes=5, img_size=64, num_workers=0, scale_range=(1.0, 1.0))
    dm.setup("fit")
    with pytest.raises(ValueError, match=f"annotation .*{bad.name}: label value 9 is above num_classes=5"):
        dm.datasets["train"].dataset[0]
    image, mask = dm.datasets["val"][0]
    assert image.shape == (3, 64, 64) and mask.shape == (64, 64) and mask.max() < 5


@pytest.mark.parametrize("detector", ["faster_rcnn", "mask_rcnn"])
def test_detection_per_image_loss_and_metrics(tmp_path, detector) -> None:
    from splitlab.data import CocoDetectionData, generate_coco
    from splitlab.tasks import DetectionTask

    root = generate_coco(tmp_path / "coco", image_size=64, train=4, val=2)
    dm = CocoDetectionData(
        root=str(root), img_size=64, masks=detector == "mask_rcnn", batch_size=3, num_workers=0
    )
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    task = DetectionTask(
        num_classes=3,
        detector=detector,
        backbone="vit_tiny_patch16_224",
        backbone_kwargs={"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
        levels=[32, 16, 8],
        pyramid_channels=16,
        pyramid_indices=[1],
        anchor_sizes=[8, 16, 32, 64],
        representation_size=32,
        decision_dim=16,
        decision_heads=2,
    )
    for stage in ("warm_start", "ppo"):  # RPN proposals, then the layout-independent reference proposals
        task.stage = stage
        outputs, layout = task(images)
        loss = task.per_sample_loss(outputs, targets)
        assert loss.shape == (3,) and torch.isfinite(loss).all()
    loss.mean().backward()
    assert task.head["pyramid"].outputs[0][0].weight.grad is not None
    metrics = task.build_metrics()
    with torch.no_grad():
        outputs, layout = task(images)
        task.update_metrics(metrics, outputs, targets, layout)
    assert 0.0 <= metrics.compute()["map"].item() <= 1.0
