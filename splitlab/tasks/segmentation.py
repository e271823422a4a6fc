"""`SegmentationTask`: SPLIT semantic segmentation with mmsegmentation decode heads, and
`SegmentationLogic`, its own code (loss, metrics, annotations, data checks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from splitlab.metrics import FineCoverage, cell_classes
from splitlab.model import SplitModel, SplitSegmenter
from splitlab.model.head_settings import SegmentationHeadSettings
from splitlab.tasks.dense import DenseTask
from splitlab.tasks.logic import LossInputs, RunFacts, TaskLogic
from splitlab.tokenizer import TokenLayout

COVERAGE_COLUMNS = ("object_fine_coverage", "boundary_fine_coverage", "thin_fine_coverage")


@dataclass(frozen=True)
class SegmentationSettings:
    """What segmentation's code reads of its task's settings (`SegmentationLogic` says what each is)."""

    ignore_index: int = 255
    aux_weight: float = 0.4
    background_classes: Sequence[int] = ()
    thin_classes: Sequence[int] = ()


class SegmentationLogic(TaskLogic):
    """Segmentation's own code: each image's mean pixel cross-entropy, mIoU, pixel accuracy and
    where the fine tokens go (`FineCoverage`).

    Args:
        model: the task's `SplitSegmenter` (or a multi-task model's segmentation member): its head
            gives the classes.
        ignore_index: unlabelled pixels (padding too): neither trained nor scored.
        aux_weight: weight of the auxiliary head's loss.
        background_classes: classes that are not objects, for the fine-coverage metric.
        thin_classes: classes that are thin structures (poles, wires; the hard twin's lines, grids and
            rings): their cells' fine-token coverage is its own column (``thin_fine_coverage``).
    """

    task_name = "segmentation"
    metric_name = "miou"

    settings_class = SegmentationSettings

    def __init__(self, model: SplitModel, settings: SegmentationSettings) -> None:
        num_classes, ignore_index, aux_weight = (
            model.head_settings.num_classes,
            settings.ignore_index,
            settings.aux_weight,
        )
        background_classes, thin_classes = settings.background_classes, settings.thin_classes
        for name, classes in (("background_classes", background_classes), ("thin_classes", thin_classes)):
            outside = [c for c in classes if not 0 <= c < num_classes]
            if outside:
                raise ValueError(f"{name} {outside} are not classes of num_classes={num_classes}")
        super().__init__(model, settings)
        self.num_classes, self.ignore_index, self.aux_weight = num_classes, ignore_index, aux_weight
        self.background_classes, self.thin_classes = background_classes, tuple(thin_classes)

    def check_data(self, datamodule: Any, run: RunFacts) -> None:
        """One ``ignore_index`` for data and model (else padding and unlabelled pixels are trained and
        scored as a class), and, when training, at least 2 images per BatchNorm step."""
        data_hp = getattr(datamodule, "hparams", {})
        theirs, mine = data_hp.get("ignore_index"), self.ignore_index
        if theirs is not None and int(theirs) != int(mine):
            raise ValueError(
                f"data.init_args.ignore_index={theirs} but model.init_args.ignore_index={mine}: the data marks "
                "padding and unlabelled pixels with its value, the loss and metrics skip the model's; set both alike"
            )
        batch = getattr(datamodule, "batch_size", data_hp.get("batch_size"))
        has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.head.modules())
        # trainer.sync_batchnorm=true keeps a layer sync (the BatchNorms are converted later, in the
        # strategy's setup): then each BatchNorm sees every rank's images
        synced = run.fitting and run.synced_batchnorm
        per_norm = int(batch) * (run.world_size if synced else 1) if batch is not None else 2
        if run.fitting and has_bn and per_norm < 2:
            raise ValueError(
                f"data.init_args.batch_size={batch}: the decode head's BatchNorm needs at least 2 images per "
                "training step (UPerHead's 1x1 pooling branch has one value per image); use batch_size >= 2, "
                "or several GPUs with trainer.sync_batchnorm=true"
                + ("" if run.world_size < 2 else f" (this run: {run.world_size} GPUs, not synced)")
            )

    def own_targets(self, reference: dict[str, Tensor], targets: Tensor) -> Tensor:
        """The finest grid's per-pixel classes, at the masks' size; padding (``ignore_index``) kept."""
        predicted = self.head.predict_masks(reference, targets.shape[-2:])
        return torch.where(targets == self.ignore_index, targets, predicted)

    def per_image_loss(self, outputs: dict[str, Tensor], targets: Tensor, inputs: LossInputs) -> Tensor:
        return self.head.per_image_loss(outputs, targets, self.ignore_index, self.aux_weight)

    def build_metrics(self) -> MetricCollection:
        classes, ignore = self.num_classes, self.ignore_index
        return MetricCollection(
            {
                "miou": MulticlassJaccardIndex(classes, ignore_index=ignore, average="macro"),
                "pixel_accuracy": MulticlassAccuracy(classes, ignore_index=ignore, average="micro"),
                "coverage": FineCoverage(self.finest, ignore, self.background_classes, self.thin_classes),
            },
            compute_groups=False,
        )

    def update_metrics(
        self, metrics: MetricCollection, outputs: dict[str, Tensor], targets: Tensor, layout: TokenLayout
    ) -> None:
        preds = self.head.predict_masks(outputs, targets.shape[-2:])
        metrics["miou"].update(preds, targets)
        metrics["pixel_accuracy"].update(preds, targets)
        metrics["coverage"].update(layout, targets)

    def annotated_cells(self, batch: Any, grid: tuple[int, int]) -> Tensor:
        """The finest cells on an object (a class not in ``background_classes``) or on a class
        boundary: the cells the coverage metric counts, where a coarse token blurs the answer."""
        _, targets = self.unpack_batch(batch)
        cell = self.finest
        size = (grid[0] * cell, grid[1] * cell)
        if tuple(targets.shape[-2:]) != size:
            targets = F.interpolate(targets[:, None].float(), size=size, mode="nearest")[:, 0].long()
        is_object, boundary = cell_classes(targets, cell, self.ignore_index, self.background_classes)
        return is_object | boundary

    def finish_results(self, results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """Masks without a labelled pixel define no mIoU, accuracy or coverage: null, said once."""
        empty = [policy for policy, row in results.items() if row.get("labelled_pixels", 1.0) == 0]
        for policy in empty:
            for key in ("miou", "pixel_accuracy", *COVERAGE_COLUMNS):
                results[policy][key] = float("nan")
        if empty:
            rank_zero_warn(
                f"the evaluation masks hold no labelled pixels (every pixel is ignore_index={self.ignore_index}): "
                "mIoU, pixel accuracy and fine-token coverage are not defined and are reported as null"
            )
        return super().finish_results(results)

    def summary_columns(self) -> list[str]:
        """With thin classes named (the hard twin), the three coverages beside the mIoU."""
        return list(COVERAGE_COLUMNS) if self.thin_classes else []

    def describe_prediction(
        self, outputs: dict[str, Tensor], index: int, target: Any = None
    ) -> dict[str, Any]:
        classes = outputs["logits"][index].argmax(0).unique().tolist()
        return {"classes_present": classes}


class SegmentationTask(DenseTask):
    """Semantic segmentation: simple feature pyramid + an mmseg decode head (`splitlab.heads.SegmentationHead`).

    The per-sample loss is each image's mean pixel cross-entropy (plus ``aux_weight`` times the
    auxiliary head's). Besides mIoU it reports where the fine tokens go (`FineCoverage`). The task's
    own code is `SegmentationLogic`'s.

    Args:
        num_classes: classes (150 for ADE20K).
        decode_head: mmseg head config overriding UPerHead's defaults.
        auxiliary_head: mmseg head config for an auxiliary head (``{}`` for an FCN head on
            level 2), or None for none.
        aux_weight: weight of the auxiliary loss.
        ignore_index: unlabelled pixels.
        background_classes: classes that are not objects, for the fine-coverage metric.
        thin_classes: classes that are thin structures, for the thin-structure coverage column.
        **kwargs: `DenseTask` arguments (``pyramid_channels``, ``pyramid_indices``) and `SplitTask`'s.
    """

    task_name = SegmentationLogic.task_name
    metric_name = SegmentationLogic.metric_name
    model_class = SplitSegmenter
    logic_class = SegmentationLogic

    def __init__(
        self,
        num_classes: int = SegmentationHeadSettings.num_classes,
        decode_head: dict[str, Any] | None = SegmentationHeadSettings.decode_head,
        auxiliary_head: dict[str, Any] | None = SegmentationHeadSettings.auxiliary_head,
        aux_weight: float = SegmentationSettings.aux_weight,
        ignore_index: int = SegmentationSettings.ignore_index,
        background_classes: Sequence[int] = SegmentationSettings.background_classes,
        thin_classes: Sequence[int] = SegmentationSettings.thin_classes,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
