"""`splitlab.model.calibrate` and ``splitlab calibrate``: a model whose cut misses its budget on images
unlike its training data meets it after re-fitting the cuts on such images, on held-out ones too;
predict says when the budget is missed."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from splitlab.commands import main
from splitlab.data.generators.dense_scenes import render_scene
from splitlab.model import load
from splitlab.model.calibrate import calibrate
from splitlab.model.predict import BUDGET_ERRORS, BUDGET_TOLERANCE, mean_and_error
from tests.model.helpers import tiny_model

PER_FOLDER = 160  # enough 64 px images that two folders' mean fractions agree within ~0.01


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> tuple[list, list]:
    """Two folders of generated scenes (another generator than any training data here): one to
    calibrate on, one held out."""
    root = tmp_path_factory.mktemp("scenes")
    rng = np.random.default_rng(7)
    folders = []
    for name in ("calibrate", "held_out"):
        folder = root / name
        folder.mkdir()
        for i in range(PER_FOLDER):
            Image.fromarray(render_scene(rng, 64)[0]).save(folder / f"{i:03d}.png")
        folders.append(sorted(folder.iterdir()))
    return folders[0], folders[1]


def off_budget(**settings):
    """A tiny classifier whose cuts split nearly everything: far above its budget on any image."""
    model = tiny_model("classification", **settings)
    model.tokenizer.operating_points.cuts.fill_(-30.0)
    return model


def mean_fraction(model, files, **options) -> float:
    return float(np.mean([r["token_fraction"] for r in model.predict(files, num_workers=0, **options)]))


def test_calibrating_on_images_of_a_kind_meets_every_budget_on_held_out_ones(scenes) -> None:
    calibrate_on, held_out = scenes
    model = off_budget()
    with pytest.warns(
        UserWarning,
        match=r"mean token fraction of these 160 image\(s\) is (1\.000|0\.9\d\d) ± 0\.\d{3} \(standard error\), for a "
        r"budget of 0\.5: 0\.\d{3} off",
    ):
        assert mean_fraction(model, held_out) > 0.9
    done = calibrate(model, calibrate_on)
    assert (done.images, done.budget, done.folds) == (PER_FOLDER, 0.5, 5) and done.before > 0.9
    assert done.after == pytest.approx(0.5, abs=0.03)
    for budget in (0.3, 0.5, 0.7):  # a budget-conditioned policy: every point re-fitted
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            fractions = [r["token_fraction"] for r in model.predict(held_out, num_workers=0, budget=budget)]
        mean, error = mean_and_error(fractions)
        assert mean == pytest.approx(budget, abs=0.03)
        # at the budget it was calibrated for, the cut's own standard error counts with the sample's
        both = math.hypot(error, done.expected_error) if budget == done.budget else error
        missed = abs(mean - budget) > max(BUDGET_TOLERANCE, BUDGET_ERRORS * both)
        assert bool(said) == missed, [str(w.message) for w in said]  # said only when missed, with the numbers
        if budget == 0.5:  # what calibrate expected on new images of the kind is what they show
            spread = math.hypot(done.expected_error, error)
            assert abs(done.expected - mean) < 3 * spread, (done.expected, done.expected_error, mean, error)
    decisions = model.tokenizer.decision.mlp.fc2.weight.clone()
    assert torch.equal(decisions, off_budget().tokenizer.decision.mlp.fc2.weight)  # the policy is as it was


def test_a_budget_is_calibrated_under_the_models_cap_and_apts_cuts_too(scenes) -> None:
    calibrate_on, held_out = scenes
    capped = off_budget(max_fraction=0.6)
    calibrate(capped, calibrate_on, budget=0.5)
    assert mean_fraction(capped, held_out) == pytest.approx(0.5, abs=0.03)
    apt = tiny_model("classification", policy="entropy")
    done = calibrate(apt, calibrate_on, budget=0.5)
    assert done.after == pytest.approx(0.5, abs=0.03)
    assert mean_fraction(apt, held_out) == pytest.approx(0.5, abs=0.03)
    with pytest.raises(ValueError, match="policy='random', whose layouts do not depend on a calibrated cut"):
        calibrate(tiny_model("classification", policy="random"), calibrate_on)


def test_the_command_writes_a_calibrated_model_that_predict_then_serves(scenes, tmp_path, capsys) -> None:
    calibrate_on, held_out = scenes
    off_budget().save_pretrained(tmp_path / "model")
    folder = str(calibrate_on[0].parent)
    command = [
        "calibrate",
        str(tmp_path / "model"),
        folder,
        "--out",
        str(tmp_path / "cut"),
        "--num-workers",
        "0",
    ]
    with pytest.raises(SystemExit) as stop:
        main(command)
    said = capsys.readouterr().out
    assert (
        stop.value.code == 0
        and f"calibrated on {PER_FOLDER} image(s): mean token fraction at budget 0.5" in said
        and "on new images of this kind expect 0." in said
        and "(policy learned, cuts calibrated for budget 0.3, 0.4, 0.5, 0.6, 0.7)" in said  # what it holds
    )
    assert mean_fraction(load(tmp_path / "cut"), held_out) == pytest.approx(0.5, abs=0.03)
    with pytest.raises(SystemExit) as stop:  # the calibrated model is never written over
        main(command)
    assert stop.value.code == 2 and "--out" in capsys.readouterr().err
    said = f"splitlab calibrate {tmp_path / 'model'} IMAGES --out DIR"  # predict says the budget was missed
    with pytest.raises(SystemExit) as stop, pytest.warns(UserWarning, match=re.escape(said)):
        main(
            [
                "predict",
                str(tmp_path / "model"),
                str(held_out[0].parent),
                "--out",
                str(tmp_path / "p"),
                "--num-workers",
                "0",
            ]
        )
    assert stop.value.code == 0 and "for a budget of 0.5" in capsys.readouterr().out
