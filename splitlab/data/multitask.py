"""`MultiTaskData`: each task's own data module, by name, for `splitlab.tasks.MultiTaskSplit`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning import LightningDataModule
from lightning.pytorch.cli import instantiate_class
from lightning.pytorch.utilities import CombinedLoader

from splitlab.lightning_private import outside_given_hyperparameters


def build_data(name: str, given: Any) -> LightningDataModule:
    """A task's data module: given built, or from its ``{class_path, init_args}``. Built here rather
    than by the CLI's parser, so that it records its own settings as its hyperparameters (inside
    the parser's building of this module it would record this module's)."""
    if isinstance(given, LightningDataModule):
        return given
    if not isinstance(given, dict) or "class_path" not in given:
        raise ValueError(
            f"data.init_args.task_data.{name}: expected a data module's {{class_path, init_args}}, got {given!r}"
        )
    try:
        with outside_given_hyperparameters():
            data = instantiate_class((), {"init_args": {}, **given})
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"data.init_args.task_data.{name}.class_path={given['class_path']!r}: {err}"
        ) from None
    if not isinstance(data, LightningDataModule):
        raise ValueError(
            f"data.init_args.task_data.{name}.class_path={given['class_path']!r} is no LightningDataModule"
        )
    return data


class MultiTaskData(LightningDataModule):
    """Several data modules under the task names of a multi-task model (`MultiTaskSplit`'s ``tasks``).

    Each batch holds a batch of every task, ``{name: batch}`` (Lightning's `CombinedLoader`): in
    training the shorter loaders start again until the longest has run once (``max_size_cycle``, an
    epoch is the longest task's), in evaluation every loader runs once and a task whose loader has
    run out is left out of the batch (``max_size``). Each module keeps its own batch size, workers,
    transforms and shuffling (resumable, as every splitlab data module's).

    Args:
        task_data: task name -> its data module (``CocoDetectionData``, ``ADE20KData``, ...) as
            ``{class_path, init_args}`` (or built, from Python), each read at the model's image size.
        img_size: the image side every task's data is read at (linked to the model's input size:
            a task module's own ``img_size`` is replaced); None leaves each module's own.
        task_classes: task name -> class count, for the modules that have one (segmentation's;
            linked to the model's ``tasks``).
    """

    def __init__(
        self,
        task_data: dict[str, dict[str, Any]],
        img_size: int | None = None,
        task_classes: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        if not task_data:
            raise ValueError(
                "data.init_args.task_data: name each task's data module (the model's task names)"
            )
        self.save_hyperparameters()
        self.tasks = {name: build_data(name, given) for name, given in task_data.items()}
        if img_size is not None:  # the model's input size, for every task (as the links set one module's)
            for data in self.tasks.values():
                if "img_size" in getattr(data, "hparams", {}):
                    data.hparams.img_size = int(img_size)
                if hasattr(data, "img_size"):
                    data.img_size = int(img_size)
        for name, classes in (task_classes or {}).items():  # each task's, from the model (linked)
            data = self.tasks.get(name)
            if data is not None and "num_classes" in getattr(data, "hparams", {}):
                data.hparams.num_classes = int(classes)

    @property
    def img_size(self) -> int | None:
        sizes = {getattr(data, "img_size", None) for data in self.tasks.values()} - {None}
        return sizes.pop() if len(sizes) == 1 else None

    def _each(self, call: Callable[[LightningDataModule], Any]) -> dict[str, Any]:
        return {name: call(data) for name, data in self.tasks.items()}

    def prepare_data(self) -> None:
        self._each(lambda data: data.prepare_data())

    def setup(self, stage: str) -> None:
        for data in self.tasks.values():
            data.trainer = self.trainer
            data.setup(stage)

    def teardown(self, stage: str) -> None:
        self._each(lambda data: data.teardown(stage))

    def train_dataloader(self) -> CombinedLoader:
        return CombinedLoader(self._each(lambda data: data.train_dataloader()), "max_size_cycle")

    def val_dataloader(self) -> CombinedLoader:
        return CombinedLoader(self._each(lambda data: data.val_dataloader()), "max_size")

    def test_dataloader(self) -> CombinedLoader:
        return CombinedLoader(self._each(lambda data: data.test_dataloader()), "max_size")

    def skipped_report(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> str | None:
        """Every task's skipped samples (`BaseDataModule.skipped_report`), task by task."""
        reports = {
            name: data.skipped_report(reduce)
            for name, data in self.tasks.items()
            if hasattr(data, "skipped_report")
        }
        lines = [f"{name}: {report}" for name, report in reports.items() if report]
        return "; ".join(lines) or None

    def state_dict(self) -> dict[str, Any]:
        return self._each(lambda data: data.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, state in state_dict.items():
            if name in self.tasks:
                self.tasks[name].load_state_dict(state)
