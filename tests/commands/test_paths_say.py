"""Every path says what it holds (issue 58): an interrupted run is reported as what it is, a saved
model that contradicts itself is refused, every tool refuses bad files and empty inputs in one line,
renamed settings point to their new names, and ``splitlab --help`` lists every command."""

from __future__ import annotations

import contextlib
import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import splitlab
from splitlab.commands import TOOLS, main
from splitlab.commands.calibrate import expectation
from splitlab.model.calibrate import Calibrated
from splitlab.model.predict import budget_note
from tests.model.helpers import tiny_model


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    captured = capsys.readouterr()
    return stop.value.code, captured.out, captured.err


def test_help_lists_every_command(capsys) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("fit", "validate", "test", "predict", *TOOLS):
        assert f"\n    {command}" in out or f"\n  {command}" in out, command
    code, _, err = run(capsys)  # no command at all: the same list, and a failure
    assert code == 2 and "convert-checkpoint" in err


@pytest.mark.parametrize(
    ("stage", "steps", "state"),
    [
        ("warm_start", 0, "imitation"),
        ("ppo", 0, "imitation"),
        ("ppo", 12, "learned"),
        ("dense", 0, "uniform"),
    ],
)
def test_a_saved_model_says_how_far_its_training_went(tmp_path, stage, steps, state, recwarn) -> None:
    model = tiny_model("classification")
    model.trained = {"stage": stage, "ppo_steps": steps}
    model.save_pretrained(tmp_path / "m")
    loaded = splitlab.load(tmp_path / "m")
    assert loaded.policy_state == state
    warned = [str(w.message) for w in recwarn if "finish the run" in str(w.message)]
    assert bool(warned) == (state == "imitation")
    if state == "imitation":
        assert "policy imitation" in warned[0] and "--ckpt_path last" in warned[0]
        assert "PPO never trained it" in loaded.holds()
    if state == "learned":
        assert loaded.holds().startswith(f"policy learned (PPO: {steps} steps)")


def test_predict_reports_an_imitation_policy_as_such(tmp_path, capsys) -> None:
    model = tiny_model("classification")
    model.trained = {"stage": "warm_start", "ppo_steps": 0}
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "in").mkdir()
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp_path / "in" / "a.png")
    with pytest.warns(UserWarning, match="finish the run"):
        code, out, _ = run(
            capsys, "predict", str(tmp_path / "m"), str(tmp_path / "in"), "--out", str(tmp_path / "o")
        )
    assert code == 0 and "(policy imitation (training stopped in its warm start" in out


def test_predict_refuses_inputs_with_no_image_and_a_training_runs_folder(tmp_path, capsys) -> None:
    tiny_model("classification").save_pretrained(tmp_path / "m")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "broken.png").write_text("not an image")
    code, _, err = run(
        capsys, "predict", str(tmp_path / "m"), str(tmp_path / "in"), "--out", str(tmp_path / "o")
    )
    assert code == 2 and "no image could be read among the 1 file(s)" in err
    assert not (tmp_path / "o" / "predictions.jsonl").exists()
    run_folder = tmp_path / "run"
    (run_folder / "checkpoints").mkdir(parents=True)
    code, _, err = run(capsys, "predict", str(tmp_path / "m"), str(tmp_path / "in"), "--out", str(run_folder))
    assert code == 2 and "a training run's folder (it holds checkpoints/)" in err


def test_a_config_that_contradicts_itself_is_refused_naming_both_fields(tmp_path) -> None:
    tiny_model("classification").save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["preprocessing"]["img_size"] = 96
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"preprocessing.img_size=\[96, 96\] contradicts backbone_kwargs.img_size=\[64, 64\]"
    ):
        splitlab.load(tmp_path / "m")


def test_convert_checkpoint_diagnoses_files_as_load_does(tmp_path, capsys) -> None:
    text = tmp_path / "notes.ckpt"
    text.write_text("hello")
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"a": torch.ones(2)}, foreign)
    cases = [
        ([str(text), str(tmp_path / "a.ckpt")], "a text file (5 bytes, beginning 'hello')"),
        ([str(foreign), str(tmp_path / "b.ckpt")], "holds a dict of ['a'], not a splitlab task's checkpoint"),
        ([str(foreign), str(tmp_path / "no" / "c.ckpt")], f"{str(tmp_path / 'no')!r}, the folder of"),
    ]
    for argv, said in cases:
        code, _, err = run(capsys, "convert-checkpoint", *argv)
        assert code == 2 and said in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.ckpt", "notes.ckpt"]  # nothing written


def test_renamed_options_of_the_tools_name_the_new_one(capsys) -> None:
    code, _, err = run(capsys, "data", "shapes", "--image-size", "32", "--out", "x")
    assert code == 2 and "--image-size was renamed --img-size" in err


@pytest.mark.parametrize("size", [32, 40, 48, 50, 63])
def test_hard_data_at_every_size_the_check_allows_and_never_partial(tmp_path, capsys, size) -> None:
    out = tmp_path / "coco"
    code, said, _ = run(capsys, "data", "coco", "--difficulty", "hard", "--img-size", str(size), "--train", "2",
                        "--val", "1", "--out", str(out))  # fmt: skip
    assert code == 0 and "wrote coco-format dataset" in said
    assert (out / "annotations" / "instances_val2017.json").is_file()
    code, _, err = run(capsys, "data", "coco", "--out", str(out))  # a folder that holds a dataset
    assert code == 2 and "holds files already" in err
    assert [p.name for p in tmp_path.iterdir()] == ["coco"]  # no .partial left behind


def test_the_budget_miss_counts_the_calibrations_error_and_calibrate_says_what_to_expect() -> None:
    model = tiny_model("classification")
    fractions = [0.472 + 0.25 * ((i % 2) * 2 - 1) for i in range(500)]  # mean 0.472, standard error 0.011
    assert budget_note(model, fractions, 0.5, None) is not None  # 2.5 standard errors of the sample alone
    model.calibration = {"budget": 0.5, "images": 500, "expected": 0.501, "error": 0.011, "spread": 0.25}
    assert budget_note(model, fractions, 0.5, None) is None  # with the calibration's: 1.8
    said = expectation(Calibrated(500, 0.5, 0.53, 0.5, 0, 0.501, 0.011, 5))
    assert "a new sample of 500 such images: its mean within 0.501 ± 0.031" in said


@pytest.mark.parametrize(
    ("stage", "steps", "state"),
    [("warm_start", 0, "imitation"), ("ppo", 0, "imitation"), ("ppo", 5, "learned"), ("dense", 0, "uniform")],
)
def test_a_task_checkpoint_records_how_far_training_went(tmp_path, stage, steps, state) -> None:
    """What `splitlab.load` reads of a ``.ckpt``: the stage and the PPO steps the task saved; a checkpoint
    written before the record (its stage only) is read from the stage."""
    from splitlab.tasks import ClassificationTask
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, **TINY)
    task.algorithm.progress.restore({"stage": stage, "ppo_steps": steps})
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(checkpoint)
    assert checkpoint["splitlab"]["ppo_steps"] == steps
    torch.save(checkpoint, tmp_path / "run.ckpt")
    with pytest.warns(UserWarning) if state == "imitation" else contextlib.nullcontext():
        assert splitlab.load(tmp_path / "run.ckpt").policy_state == state
    del checkpoint["splitlab"]["model"]["trained"], checkpoint["splitlab"]["ppo_steps"]  # an older file
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = splitlab.load(tmp_path / "old.ckpt").policy_state
    assert old == ("learned" if stage == "ppo" else state)
    reloaded = ClassificationTask(num_classes=4, **TINY)
    reloaded.on_load_checkpoint(checkpoint)
    assert reloaded.stage == stage and reloaded.algorithm.progress.ppo_steps == (1 if stage == "ppo" else 0)
