"""SPLIT from a user's own Python: ``Trainer().fit(task, data)`` with no callbacks trains what
``lightning fit`` trains (the task supplies the run's callbacks), and a user's own schedule wins."""

from __future__ import annotations

import json
import math

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

import splitlab
from splitlab.callbacks import GracefulStop, SplitSchedule
from splitlab.cli import lightning_main
from splitlab.data import ImageClassificationData
from splitlab.report import summary_record, write_summary
from splitlab.tasks import ClassificationTask
from tests.helpers import tiny_args


def python_fit(settings: dict, data_settings: dict, log_dir, callbacks=()) -> L.Trainer:
    """What the README's "Train from Python" does, with the CLI twin's settings."""
    L.seed_everything(0)  # as the recipe's seed_everything: 0
    task = ClassificationTask(**settings)
    data = ImageClassificationData(**data_settings)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=CSVLogger(log_dir, name="", version=""),
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(task, data)
    return trainer


def rows(summary: dict) -> dict:
    """Each policy's numbers, without its timing."""
    return {
        name: {k: v for k, v in row.items() if k != "images_per_second"}
        for name, row in summary["policies"].items()
    }


@pytest.fixture(scope="module")
def cli_run(shapes_root, tmp_path_factory):
    """The classification twin under ``lightning fit``, its recipe's callbacks left out: the CLI's
    defaults (1 warm-start epoch, then PPO)."""
    out = tmp_path_factory.mktemp("cli")
    cli = lightning_main(
        ["fit", *tiny_args(shapes_root, out, "--trainer.max_epochs=2", "--trainer.callbacks=[]")]
    )
    settings = {k: v for k, v in cli.model.hparams.items() if not k.startswith("_")}
    data_settings = {k: v for k, v in cli.datamodule.hparams.items() if not k.startswith("_")}
    return out, settings, data_settings


def test_a_plain_trainer_fit_trains_what_lightning_fit_trains(cli_run, shapes_root, tmp_path) -> None:
    out, settings, data_settings = cli_run
    trainer = python_fit(settings, data_settings, tmp_path)
    task = trainer.lightning_module
    assert task.stage == "ppo" and task.hparams.policy == "learned"
    assert any(isinstance(c, SplitSchedule) for c in trainer.callbacks)
    assert sum(type(c) is GracefulStop for c in trainer.callbacks) == 1
    expected = json.loads((out / "summary.json").read_text())
    got = json.loads((tmp_path / "summary.json").read_text())
    assert got["trained_policy"] == expected["trained_policy"] == "learned"
    assert got["lambda"] == pytest.approx(expected["lambda"], abs=1e-6)
    want, have = rows(expected), rows(got)
    assert set(have) == set(want)
    for name, row in want.items():
        for key, value in row.items():
            same = (
                math.isclose(have[name][key], value, abs_tol=1e-6)
                if value is not None
                else have[name][key] is None
            )
            assert same, (name, key, have[name][key], value)
    # what the run trained is the deployable model: saved, loaded and used on image files
    task.model.save_pretrained(tmp_path / "model")
    files = sorted((shapes_root / "test").rglob("*.png"))[:2]
    predictions = splitlab.load(tmp_path / "model").predict(files)
    assert [p["class"] for p in predictions] == [p["class"] for p in task.model.predict(files)]


def test_the_users_own_schedule_wins_and_an_imitation_only_policy_is_not_called_learned(
    cli_run, tmp_path
) -> None:
    _, settings, data_settings = cli_run
    trainer = python_fit(settings, data_settings, tmp_path, [SplitSchedule(warm_start_epochs=2, rl_epochs=0)])
    schedules = [c for c in trainer.callbacks if isinstance(c, SplitSchedule)]
    assert len(schedules) == 1 and schedules[0].rl_epochs == 0
    assert trainer.lightning_module.stage == "warm_start"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trained_policy"] == "imitation" and "learned" not in summary["policies"]
    assert {"imitation", "uniform", "random", "oracle"} <= set(summary["policies"])


def test_a_plain_loop_driving_the_training_object_trains_what_trainer_fit_trains(
    cli_run, shapes_root, tmp_path
) -> None:
    """`SplitTraining` is the algorithm, whoever drives it: a plain loop over the same batches (the
    same stages, optimizers, steps and sampling stream, no Lightning in the loop) ends with the
    weights, λ and operating points `Trainer().fit` ends with, and its `PolicyComparison`, fed the
    validation batches, writes the summary the fit wrote. The deployed cuts are the training steps'
    own running calibration in both (``calibration_images: 0``)."""
    from dataclasses import replace

    import torch

    _, settings, data_settings = cli_run
    settings = {**settings, "evaluation": replace(settings["evaluation"], calibration_images=0)}
    fitted = python_fit(settings, data_settings, tmp_path / "fit").lightning_module

    L.seed_everything(0)
    task = ClassificationTask(**settings)
    data = ImageClassificationData(**data_settings)
    data.setup("fit")
    task.adopt_data(data)  # the names and preprocessing the summary's run records
    training, loader = task.algorithm, data.train_dataloader()
    steps = training.optimizers(len(loader), len(loader))  # one warm-start epoch, one PPO epoch
    task.train()
    for epoch, stage in enumerate(("warm_start", "ppo")):
        training.enter(stage)
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            images, targets = training.task.unpack_batch(batch)
            training.training_step(images, targets, batch, steps)

    mine, theirs = task.state_dict(), fitted.state_dict()
    assert mine.keys() == theirs.keys()
    for key in mine:
        torch.testing.assert_close(mine[key], theirs[key], rtol=1e-5, atol=1e-6, msg=key)
    assert training.progress.record() == fitted.algorithm.progress.record()
    # evaluated without Lightning too: the task's comparison, fed the validation batches
    task.eval()
    with torch.inference_mode():
        for index, batch in enumerate(data.val_dataloader()):
            task.comparison.step(batch, index, "val")
    results = task.comparison.results("val")
    lam = task.controller.value_at(task.budget)
    write_summary(summary_record("classification", "top1", task.budget, lam, results, "validate"), tmp_path)
    expected = json.loads((tmp_path / "fit" / "summary.json").read_text())
    got = json.loads((tmp_path / "summary.json").read_text())
    assert expected["trained_policy"] == "learned"
    assert got["lambda"] == pytest.approx(expected["lambda"], abs=1e-6)
    want, have = rows(expected), rows(got)
    assert set(have) == set(want) and {"learned", "uniform"} <= set(want)
    for name, row in want.items():
        for key, value in row.items():
            assert have[name][key] == pytest.approx(value, abs=1e-6), (name, key)
