"""Each model's head settings are one dataclass: config.json's ``head`` is made from it, an unknown
setting is refused by name, and a task's signature and its code take their defaults from it."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import pytest

from splitlab.heads import DetectorSettings
from splitlab.model import SplitModel
from splitlab.model.head_settings import DetectionHeadSettings, SegmentationHeadSettings
from splitlab.tasks import ClassificationTask, DetectionTask, SegmentationTask, VQATask
from tests.model.helpers import BASE, HEADS, tiny_model


@pytest.mark.parametrize("task", ["classification", "detection", "segmentation"])
def test_config_head_is_the_settings_dataclass_whole(task: str) -> None:
    model = tiny_model(task)
    settings = model.head_settings
    assert isinstance(settings, model.head_settings_class)
    assert set(model.config["head"]) == {f.name for f in fields(settings)}
    for key, value in HEADS[task].items():  # what the config gave is what the model holds
        held = getattr(settings, key)
        assert (vars(held) if key == "detector" else held) == (
            vars(DetectorSettings(**value)) if key == "detector" else value
        )
    rebuilt = SplitModel.from_config(model.config)  # config.json's head rebuilds the same settings
    assert rebuilt.head_settings == settings


def test_an_unknown_head_setting_is_refused_by_name() -> None:
    config = {**BASE, "task": "segmentation", "head": {**HEADS["segmentation"], "num_clases": 3}}
    with pytest.raises(ValueError, match=r"config head: unknown settings \['num_clases'\].*num_classes"):
        SplitModel.from_config(config)


def test_a_segmenters_class_count_has_one_default_read_by_model_and_code() -> None:
    task = SegmentationTask(
        backbone_kwargs=BASE["backbone_kwargs"],
        tokenizer={"levels": [32, 16, 8]},
        pyramid_channels=16,
        pyramid_indices=[1],
    )
    default = SegmentationHeadSettings.num_classes
    assert task.model.head_settings.num_classes == default == task.logic.num_classes
    assert task.model.head.decode.conv_seg.out_channels == default


def test_the_data_sets_a_detectors_category_ids_in_settings_and_config_alike() -> None:
    model = tiny_model("detection")
    model.set_head_settings(DetectionHeadSettings(**{**model.config["head"], "category_ids": [7, 8, 9]}))
    assert model.head_settings.category_ids == model.config["head"]["category_ids"] == [7, 8, 9]
    assert model.category_id(2) == 8


@pytest.mark.parametrize("task_class", [ClassificationTask, DetectionTask, SegmentationTask, VQATask])
def test_a_tasks_head_defaults_are_its_models(task_class: type) -> None:
    """The task's signature names each head setting with the head dataclass's own default."""
    signature = inspect.signature(task_class.__init__).parameters
    dense = task_class in (DetectionTask, SegmentationTask)
    if dense:  # the pyramid's settings are DenseTask's parameters
        signature = {**inspect.signature(task_class.__mro__[1].__init__).parameters, **signature}
    for field in fields(task_class.model_class.head_settings_class):
        if field.name == "category_ids":  # from the data, not a setting of the task
            continue
        default = field.default if field.default is not MISSING else field.default_factory()
        assert signature[field.name].default == default, field.name
