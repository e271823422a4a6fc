"""Token budgets on a trained task: one conditioned policy at several budgets, budgets changed from the
command line, the hard cap, refusals, and `splitlab curve`."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from splitlab.cli import lightning_main
from splitlab.commands import run
from tests.helpers import fit, schedule_args, tiny_args


@pytest.fixture(scope="module")
def conditioned(shapes_root, tmp_path_factory):
    """A tiny budget-conditioned run (budgets 0.3-0.7, deployed at 0.5), evaluated at 0.3 too."""
    out = tmp_path_factory.mktemp("conditioned")
    fit(shapes_root, out, *schedule_args(1, 1), "--model.init_args.evaluation.eval_budgets=[0.3]")
    return out


def summary_of(command: str, shapes_root, ckpt, out, *extra: str) -> dict:
    lightning_main([command, *tiny_args(shapes_root, out, *extra), f"--ckpt_path={ckpt}"])
    return json.loads((out / "summary.json").read_text())


def test_one_policy_serves_several_budgets(conditioned) -> None:
    record = json.loads((conditioned / "summary.json").read_text())
    rows = record["policies"]
    assert set(rows) == {
        "learned",
        "uniform",
        "random",
        "entropy",
        "oracle",
        "loss_oracle",
        "learned@0.3",
        "random@0.3",
        "entropy@0.3",
        "oracle@0.3",
        "loss_oracle@0.3",
    }
    assert rows["learned@0.3"]["token_fraction_mean"] < rows["learned"]["token_fraction_mean"]
    # each baseline row is evaluated at the learned policy's realised fraction of its budget
    for suffix in ("", "@0.3"):
        learned = rows["learned" + suffix]["token_fraction_mean"]
        assert rows["entropy" + suffix]["token_fraction_mean"] == pytest.approx(learned, abs=0.03)


def test_the_budget_given_at_validate_takes_effect(conditioned, shapes_root, tmp_path) -> None:
    ckpt = conditioned / "checkpoints" / "last.ckpt"
    at_half = summary_of("validate", shapes_root, ckpt, tmp_path / "a")
    lower = summary_of("validate", shapes_root, ckpt, tmp_path / "b", "--model.init_args.budget=0.35")
    assert at_half["budget"] == 0.5 and lower["budget"] == 0.35
    assert (
        lower["policies"]["learned"]["token_fraction_mean"]
        < at_half["policies"]["learned"]["token_fraction_mean"]
    )
    with pytest.raises(ValueError, match=r"budget=0.9: this policy was trained for budgets \[0.3, 0.7\]"):
        summary_of("validate", shapes_root, ckpt, tmp_path / "c", "--model.init_args.budget=0.9")


def test_the_hard_cap_holds_on_every_image(conditioned, shapes_root, tmp_path, caplog) -> None:
    ckpt = conditioned / "checkpoints" / "last.ckpt"
    with caplog.at_level(logging.INFO):
        capped = summary_of(
            "test",
            shapes_root,
            ckpt,
            tmp_path,
            "--model.init_args.max_fraction=0.4",
            "--model.init_args.budget=0.4",
        )
    # 0.4 of 64 tokens is 25.6: 25 allowed, 4 coarse + 3 per split keeps 25, i.e. 0.391 < 0.4, said once
    said = [r.getMessage() for r in caplog.records if "out of reach" in r.getMessage()]
    assert said == [
        "max_fraction=0.4 leaves each image at most 25 of 64 tokens (whole splits), a fraction of 0.391: "
        "budget 0.4 is out of reach, met at most at 0.391 (every image at the cap)"
    ]
    rows = capped["policies"]
    assert rows["learned"]["token_fraction_max"] <= 0.4
    # calibrated for capped layouts (the fit's calibration sample kept its spread): near the cap's reach
    assert rows["learned"]["token_fraction_mean"] == pytest.approx(0.391, abs=0.03)
    assert rows["uniform"]["token_fraction_mean"] == 1.0
    learned = rows["learned"]["token_fraction_mean"]
    for baseline in ("random", "entropy"):  # at the capped policy's realised fraction, not the target
        assert rows[baseline]["token_fraction_mean"] == pytest.approx(learned, abs=0.03), baseline
    # a comparison row is not capped: it meets the matched mean fraction, single images above the cap;
    # an explicit max_fraction binds any policy
    from splitlab.model import load

    model = load(ckpt)
    assert model.cap_tokens(0.3) == int(0.3 * 8 * 8)
    images = torch.randn(32, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = model.layout(images, budget=0.3, policy="random")
        deployed = model.layout(images, budget=0.3, max_fraction=0.3)
        capped = model.layout(images, budget=0.3, policy="random", max_fraction=0.3)
    assert abs(float(base.fraction.mean()) - 0.3) <= 0.03 < float(base.fraction.max()) - 0.3
    assert float(deployed.fraction.max()) <= 0.3 and float(capped.fraction.max()) <= 0.3
    # `null` means "none" for the evaluation lists, as `[]` does
    alone = summary_of(
        "validate",
        shapes_root,
        ckpt,
        tmp_path / "alone",
        # the group given whole, as a config file gives it: jsonargparse reads a nested field's
        # ``=null`` on the command line as the text "None"
        '--model.init_args.evaluation={"eval_budgets": null, "eval_baselines": null}',
    )
    assert set(alone["policies"]) == {"learned"}


def test_the_hard_cap_binds_a_deployed_baseline(shapes_root, tmp_path) -> None:
    """APT trained in the pipeline is the deployed policy: the cap holds for it as for SPLIT."""
    fixed = ["--model.init_args.policy=entropy", "--model.init_args.budget_range=null"]
    fit(shapes_root, tmp_path / "apt", *schedule_args(1, 0), *fixed)
    ckpt = tmp_path / "apt" / "checkpoints" / "last.ckpt"
    free = summary_of("validate", shapes_root, ckpt, tmp_path / "free", *fixed)
    capped = summary_of(
        "validate", shapes_root, ckpt, tmp_path / "cap", *fixed, "--model.init_args.max_fraction=0.5"
    )
    assert free["policies"]["entropy"]["token_fraction_max"] > 0.5  # the cap has something to bind
    assert capped["policies"]["entropy"]["token_fraction_max"] <= 0.5


def test_an_unconditioned_policy_refuses_another_budget(shapes_root, tmp_path) -> None:
    single = ["--model.init_args.budget_range=null"]
    fit(shapes_root, tmp_path / "run", *schedule_args(1, 0), *single)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="the checkpoint's policy was trained for budgets 0.5 only"):
        summary_of("validate", shapes_root, ckpt, tmp_path / "v", *single, "--model.init_args.budget=0.3")
    # an extra evaluation budget is refused without naming a wrong trained budget (the overridden 0.4)
    with pytest.raises(
        ValueError, match=r"eval_budgets=0.3: a policy trained for one budget \(budget_range: null\)"
    ):
        summary_of(
            "validate",
            shapes_root,
            ckpt,
            tmp_path / "w",
            *single,
            "--model.init_args.budget=0.4",
            "--model.init_args.evaluation.eval_budgets=[0.3]",
        )
    config = next((tmp_path / "run").rglob("config.yaml"))
    with pytest.raises(ValueError, match=r"policy was trained for budget 0.5 only \(budget_range: null\)"):
        run(["curve", str(config.parent), "--ckpt", str(ckpt), "--eval-budgets", "0.3,0.5"])


def test_a_resumed_fit_refuses_changed_training_settings(conditioned, shapes_root, tmp_path) -> None:
    ckpt = conditioned / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=r"cannot change now: optim.lr: checkpoint 0.0005, given 0.002"):
        fit(
            shapes_root,
            tmp_path,
            *schedule_args(1, 2),
            "--model.init_args.optim.lr=0.002",
            f"--ckpt_path={ckpt}",
        )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "--model.init_args.budget_range=[0.01,0.5]",
            r"budget_points=0.01 is outside the range levels=\(32, 16, 8\) can reach",
        ),
        ("--model.init_args.max_fraction=0.05", r"max_fraction=0.05 is outside the range"),
        (
            "--model.init_args.evaluation.eval_budgets=[0.9]",
            r"eval_budgets=0.9: this policy was trained for budgets \[0.3, 0.7\]",
        ),
        (
            "--model.init_args.budget=0.8",
            r"budget=0.8: this policy was trained for budgets",
        ),
        ("--model.init_args.budget_range=[0.7,0.3]", "the lowest budget must be below the highest"),
    ],
)
def test_bad_budget_settings_are_refused(shapes_root, tmp_path, setting, message) -> None:
    with pytest.raises(ValueError, match=message):
        fit(shapes_root, tmp_path, setting)


def test_curve_of_a_run(conditioned, shapes_root, tmp_path) -> None:
    out = tmp_path / "curve"
    args = ["curve", str(conditioned), "--eval-budgets", "0.35,0.6", "--out", str(out)]
    # an override as two words, as a shell user types it, is passed on as one
    assert run([*args, "--data.init_args.root", str(shapes_root), "--trainer.enable_progress_bar=false"]) == 0
    record = json.loads((out / "curve.json").read_text())
    assert record["task"] == "classification" and record["metric"] == "top1"
    assert [p["target"] for p in record["points"]] == [0.35, 0.6]
    for point in record["points"]:
        assert set(point["policies"]) == {"learned", "random", "entropy", "oracle", "loss_oracle", "uniform"}
        assert set(point["policies"]["learned"]) == {
            "metric",
            "token_fraction_mean",
            "token_fraction_max",
            "images_per_second",
        }
    low, high = (p["policies"]["learned"]["token_fraction_mean"] for p in record["points"])
    assert low < high
    assert (out / "curve.png").stat().st_size > 0


def test_curve_defaults_to_the_budgets_a_run_serves(conditioned, tmp_path) -> None:
    """Without ``--eval-budgets``: a conditioned run's range ends and its target (one validate); a policy
    trained for one budget gets that budget's point (`one_point_curve` runs it on every dense task)."""
    import argparse

    from splitlab.commands.curve import curve_arguments

    argv, _ = curve_arguments(
        argparse.Namespace(run_dir=str(conditioned), eval_budgets=None, ckpt=None, out=None)
    )
    assert (
        "--model.init_args.budget=0.3" in argv
        and "--model.init_args.evaluation.eval_budgets=[0.5, 0.7]" in argv
    )
    config = tmp_path / "config.yaml"  # the same run, as if trained for 0.4 alone
    text = (conditioned / "config.yaml").read_text()
    import yaml

    settings = yaml.safe_load(text)
    settings["model"]["init_args"].update(budget_range=None, budget=0.4)
    config.write_text(yaml.safe_dump(settings))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    argv, _ = curve_arguments(
        argparse.Namespace(run_dir=str(tmp_path), eval_budgets=None, ckpt=None, out=None)
    )
    assert "--model.init_args.budget=0.4" in argv and "--model.init_args.evaluation.eval_budgets=[]" in argv


def test_curve_refuses_budgets_outside_the_trained_range(conditioned) -> None:
    with pytest.raises(ValueError, match=r"--eval-budgets: 0.2 outside .* \(budget_range: \[0.3, 0.7\]\)"):
        run(["curve", str(conditioned), "--eval-budgets", "0.2,0.5"])


@pytest.mark.parametrize(
    ("fractions", "message"),
    [("", "give at least one fraction"), ("0.3,1.5", "1.5 is not a token fraction in (0, 1]")],
)
def test_curve_refuses_bad_fractions(conditioned, capsys, fractions, message) -> None:
    with pytest.raises(SystemExit) as exit_:
        run(["curve", str(conditioned), "--eval-budgets", fractions])
    assert exit_.value.code == 2 and message.replace("\\", "") in capsys.readouterr().err.replace("\\", "")


def test_a_resumed_fit_deploys_the_budget_it_is_given(conditioned, shapes_root, tmp_path) -> None:
    """`fit --ckpt_path X --model.init_args.budget 0.35` on a conditioned policy: training goes
    on over the trained range, and what the run deploys and reports is the budget given, not the
    checkpoint's 0.5 (never silently kept)."""
    epoch0 = next((conditioned / "checkpoints").glob("epoch=0-*.ckpt"))
    fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 1),
        "--model.init_args.evaluation.eval_budgets=[0.3]",
        "--model.init_args.budget=0.35",
        f"--ckpt_path={epoch0}",
    )
    record = json.loads((tmp_path / "summary.json").read_text())
    first = json.loads((conditioned / "summary.json").read_text())
    assert first["budget"] == 0.5 and record["budget"] == 0.35
    deployed = record["policies"]["learned"]["token_fraction_mean"]
    before = first["policies"]["learned"]["token_fraction_mean"]
    # 12 validation images and cuts calibrated on 24 of a policy whose logits lie within +-0.06: both
    # runs deploy 0.05-0.1 under their budgets. The fraction moved with the budget (down by 0.15), and
    # sits nearer the budget given than the checkpoint's fraction
    assert before - deployed > 0.1 and abs(deployed - 0.35) < abs(deployed - before)


def test_a_resumed_fit_of_an_unconditioned_policy_refuses_another_budget(shapes_root, tmp_path) -> None:
    single = ["--model.init_args.budget_range=null"]
    fit(shapes_root, tmp_path / "run", *schedule_args(1, 0), *single)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="the checkpoint's policy was trained for budgets 0.5 only"):
        fit(
            shapes_root,
            tmp_path / "again",
            *schedule_args(1, 1),
            *single,
            "--model.init_args.budget=0.3",
            f"--ckpt_path={ckpt}",
        )


APT = ["--model.init_args.policy=entropy", "--model.init_args.budget_range=null"]


def test_apt_thresholds_from_the_setting_are_its_cuts(shapes_root, tmp_path) -> None:
    """``entropy_thresholds`` are APT's cuts in bits as given, no calibration: on the hand-made image
    whose patch entropies are known (0, 1, 2 and 0.811 bits) the deployed layout is the one worked
    out by hand (tests/tokenizer/test_baselines.py), whatever fraction that is."""
    from tests.tokenizer.test_baselines import hand_made_quadrants

    cli = fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 0),
        *APT,
        "--model.init_args.policy_options.entropy_thresholds=[1.0,1.5]",
    )
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert (
        saved["model.apt_cuts"].tolist() == pytest.approx([1.0, 1.5])
        and float(saved["model.apt_budget"]) == 0.5
    )
    model = cli.model.model.eval()
    mean = torch.tensor(model.preprocessing.mean).view(1, 3, 1, 1)
    std = torch.tensor(model.preprocessing.std).view(1, 3, 1, 1)
    with torch.no_grad():
        layout = model.layout((hand_made_quadrants() - mean) / std, policy="entropy")
    assert float(layout.fraction) == 22 / 64  # 1 + 1 + 4 + 16 tokens


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            [*APT, "--model.init_args.policy_options.entropy_thresholds=[5.5]"],
            r"entropy_thresholds=\[5.5\]: expected 2 values in bits",
        ),
        (
            ["--model.init_args.policy_options.entropy_thresholds=[6.0,5.0]"],
            r"entropy_thresholds=\[6.0, 5.0\] fixes the cuts of APT.*policy='learned'",
        ),
        (
            [*APT, "--model.init_args.policy_options.apt_search=grid"],
            r"apt_search='grid': expected one of \('metric', 'quantile'\)",
        ),
    ],
)
def test_bad_apt_settings_are_refused(shapes_root, tmp_path, settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        fit(shapes_root, tmp_path, *settings)


def test_apt_metric_search_waits_for_the_dense_stage(shapes_root, tmp_path, caplog) -> None:
    """The search ranks layouts by the loss of the backbone the warm start fine-tunes: with a dense
    stage in the same fit it runs when the warm start begins, not on the untrained backbone."""
    with caplog.at_level(logging.INFO):
        fit(shapes_root, tmp_path, *schedule_args(1, 0, dense=1), *APT)
    checkpoints = tmp_path / "checkpoints"
    dense = torch.load(next(checkpoints.glob("epoch=0-*.ckpt")), weights_only=False)["state_dict"]
    warm = torch.load(next(checkpoints.glob("epoch=1-*.ckpt")), weights_only=False)["state_dict"]
    assert float(dense["model.apt_budget"]) == -1.0 and float(warm["model.apt_budget"]) == 0.5
    said = [r.getMessage() for r in caplog.records if "APT's cuts" in r.getMessage()]
    assert len(said) == 1 and "metric search, 10 candidates" in said[0]
