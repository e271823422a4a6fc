"""Dense tasks: the feature pyramid, EVA-02, evaluation against pycocotools and mmseg, bad input."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch


def test_segmentation_miou_equals_mmseg_iou_metric() -> None:
    from splitlab.heads.mmseg import import_mmseg

    import_mmseg()
    from mmseg.evaluation import IoUMetric
    from torchmetrics.classification import MulticlassJaccardIndex

    gen = torch.Generator().manual_seed(0)
    classes, ignore = 6, 255
    ours = MulticlassJaccardIndex(
        classes, ignore_index=ignore, average="macro"
    )  # as SegmentationTask builds it
    reference = IoUMetric(iou_metrics=["mIoU"], ignore_index=ignore)
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
