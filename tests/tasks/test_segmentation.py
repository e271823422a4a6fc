"""`SegmentationTask`'s own metrics against mmseg's reference IoU, and its settings."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from splitlab.tasks import SegmentationTask
from splitlab.tokenizer import build_layout

TINY = {
    "backbone": "vit_tiny_patch16_224",
    "backbone_kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
    "tokenizer": {"levels": [16, 8]},
    "budget": 0.5,
    "pyramid_channels": 16,
    "pyramid_indices": [1],
    "decode_head": {"channels": 16},
    "auxiliary_head": None,
}


def test_the_tasks_miou_equals_mmseg_iou_metric() -> None:
    from splitlab.heads.mmseg import import_mmseg

    import_mmseg()
    from mmseg.evaluation import IoUMetric

    classes, ignore = 6, 255
    task = SegmentationTask(num_classes=classes, ignore_index=ignore, **TINY)
    metrics = task.build_metrics()  # what validation and test compute with
    layout = build_layout(
        [torch.zeros(2, 2, 2, 4), torch.zeros(2, 4, 4, 4)],
        [torch.ones(2, 2, 2, dtype=torch.bool)],
        task.levels,
    )
    reference = IoUMetric(iou_metrics=["mIoU"], ignore_index=ignore)
    reference.dataset_meta = {"classes": [str(c) for c in range(classes)]}
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        target = torch.randint(0, classes - 1, (2, 32, 32), generator=gen)  # class 5 never appears
        target[:, :4] = ignore
        pred = torch.where(
            torch.rand(2, 32, 32, generator=gen) < 0.7,
            target,
            torch.randint(0, classes, (2, 32, 32), generator=gen),
        )
        pred = torch.where(pred == ignore, 0, pred)
        logits = torch.nn.functional.one_hot(pred, classes).permute(0, 3, 1, 2).float()  # argmax is pred
        task.update_metrics(metrics, {"logits": logits}, target, layout)
        reference.process(
            {},
            [
                {"pred_sem_seg": {"data": p[None]}, "gt_sem_seg": {"data": t[None]}}
                for p, t in zip(pred, target, strict=True)
            ],
        )
    with contextlib.redirect_stdout(io.StringIO()):
        expected = reference.compute_metrics(reference.results)["mIoU"] / 100
    assert metrics.compute()["miou"].item() == pytest.approx(expected, abs=1e-4)
    assert 0.3 < expected < 0.9  # a real mix of right and wrong pixels, not a degenerate case


def test_the_tasks_fine_coverage_counts_only_classes_that_are_not_background() -> None:
    """32 px images on levels 16/8: a 2x2 grid of 16 px parents, the top-left one split. Pixels of a
    background ("stuff") class are not objects, whatever their value; an object cell on the split
    parent has a finest token, one elsewhere does not."""
    task = SegmentationTask(num_classes=4, background_classes=[0, 3], **TINY)
    metrics = task.build_metrics()
    split = torch.zeros(1, 2, 2, dtype=torch.bool)
    split[0, 0, 0] = True
    layout = build_layout([torch.zeros(1, 2, 2, 4), torch.zeros(1, 4, 4, 4)], [split], task.levels)
    target = torch.zeros(1, 32, 32, dtype=torch.long)
    target[0, :8, :8] = 1  # object cell (0, 0): fine, and wholly object (no boundary)
    target[0, 0, 8] = 2  # one object pixel in cell (0, 1): fine; object and boundary
    target[0, 16:24, 16:24] = 2  # object cell (2, 2): coarse
    target[0, 24:, :] = 3  # stuff (class 3): neither object nor boundary, though not class 0
    logits = torch.zeros(1, 4, 32, 32)
    task.update_metrics(metrics, {"logits": logits}, target, layout)
    values = metrics.compute()
    assert values["object_fine_coverage"].item() == pytest.approx(2 / 3)
    assert values["boundary_fine_coverage"].item() == pytest.approx(1.0)
    assert "thin_fine_coverage" not in values and task.logic.summary_columns() == []
    thin = SegmentationTask(num_classes=4, background_classes=[0, 3], thin_classes=[2], **TINY)
    metrics = thin.build_metrics()
    thin.update_metrics(metrics, {"logits": logits}, target, layout)
    assert metrics.compute()["thin_fine_coverage"].item() == pytest.approx(1 / 2)  # cells (0, 1) and (2, 2)
    assert thin.logic.summary_columns() == [
        "object_fine_coverage",
        "boundary_fine_coverage",
        "thin_fine_coverage",
    ]


def test_background_classes_must_be_classes() -> None:
    with pytest.raises(ValueError, match=r"background_classes \[7\] are not classes of num_classes=5"):
        SegmentationTask(num_classes=5, background_classes=[0, 7], **TINY)
    with pytest.raises(ValueError, match=r"thin_classes \[5\] are not classes of num_classes=5"):
        SegmentationTask(num_classes=5, thin_classes=[5], **TINY)


@pytest.mark.parametrize(
    ("batch", "world", "synced", "refused"),
    [(1, 1, False, True), (2, 1, False, False), (1, 2, False, True), (1, 2, True, False)],
    ids=["one-image", "two-images", "two-gpus-unsynced", "two-gpus-synced"],
)
def test_batchnorm_needs_two_images_per_normalisation(monkeypatch, batch, world, synced, refused) -> None:
    """Per rank without `sync_batchnorm`, over all ranks with it: a step of one image per BatchNorm fails."""
    from types import SimpleNamespace

    from lightning import Trainer
    from lightning.pytorch.trainer.states import TrainerFn

    task = SegmentationTask(num_classes=6, **TINY)
    trainer = Trainer(accelerator="cpu", devices=1, sync_batchnorm=synced, logger=False)
    trainer.state.fn = TrainerFn.FITTING
    monkeypatch.setattr(Trainer, "world_size", property(lambda self: world))
    task.trainer = trainer
    data = SimpleNamespace(batch_size=batch, hparams={"batch_size": batch})
    if refused:
        with pytest.raises(
            ValueError, match=f"data.init_args.batch_size={batch}: the decode head's BatchNorm"
        ):
            task.check_data(data)
    else:
        task.check_data(data)
