"""`splitlab demo` reuses a finished run's data and dense backbone only when they were made for the
same settings (the pipelines themselves run in tests/pipelines)."""

from __future__ import annotations

import json

import pytest

from splitlab.commands import main


def finished_demo(out, **made) -> None:
    (out / "data").mkdir(parents=True)
    (out / "data" / ".complete").write_text(
        json.dumps({"task": "classification", "seed": 0, "background": "busy", **made})
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--background", "flat"],
            "its data and dense backbone were made with --background busy, not --background flat",
        ),
        (
            ["--task", "vqa"],
            "its data and dense backbone were made with --task classification, not --task vqa",
        ),
        (["--seed", "1"], "its data and dense backbone were made with --seed 0, not --seed 1"),
    ],
    ids=["background", "task", "seed"],
)
def test_a_demo_into_a_run_made_otherwise_is_refused(tmp_path, capsys, argv, message) -> None:
    finished_demo(tmp_path / "demo")
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(tmp_path / "demo"), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"splitlab: error: --out {tmp_path / 'demo'}: {message}") and "Traceback" not in err


def test_reusing_a_run_for_another_policy_or_seed_is_the_comparison(tmp_path, capsys) -> None:
    """--reuse takes that run's data and backbone whatever made them: only the task must match."""
    finished_demo(tmp_path / "base", background="flat")
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "apt"), "--reuse", str(tmp_path / "base"), "--task", "coco"])
    err = capsys.readouterr().err
    assert err.startswith(
        f"splitlab: error: --reuse {tmp_path / 'base'}: its data and dense backbone were made "
    )
    assert "with --task classification, not --task coco" in err


class Started(Exception):
    """Raised where the demo would start training: every check before it passed."""


@pytest.mark.parametrize(
    ("made", "argv"),
    [
        ({}, ["--reuse", "{base}", "--out", "{tmp}/apt", "--policy", "entropy", "--seed", "2"]),
        ({"task": "coco"}, ["--out", "{base}", "--task", "coco", "--background", "flat"]),
    ],
    ids=["reuse-another-seed", "background-of-a-detection-run"],
)
def test_what_does_not_change_the_data_is_accepted(tmp_path, monkeypatch, made, argv) -> None:
    import splitlab.cli

    def started(args):
        raise Started

    base = tmp_path / "base"
    finished_demo(base, background="flat" if not made else "busy", **made)
    (base / "pretrain" / "checkpoints").mkdir(parents=True)
    (base / "pretrain" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (base / "pretrain" / ".complete").write_text("")
    monkeypatch.setattr(splitlab.cli, "lightning_main", started)
    with pytest.raises(Started):
        main(["demo", *(a.format(base=base, tmp=tmp_path) for a in argv)])


def test_a_stopped_stage_stops_the_demo_and_is_not_reused(tmp_path, monkeypatch) -> None:
    """Ctrl-C in the dense stage leaves a last.ckpt of an earlier epoch: the demo stops with the
    signal's exit code, and the next demo trains the dense backbone again instead of reusing it."""
    from types import SimpleNamespace

    import splitlab.cli
    from splitlab.callbacks import GracefulStop
    from splitlab.commands.demo import run_pipeline

    finished_demo(tmp_path)
    stages = []

    def fake_fit(args):
        stages.append("pretrain" if any("version=pretrain" in a for a in args) else "split")
        if stages[-1] == "split":
            (tmp_path / "summary.json").write_text("{}")
        stop = GracefulStop()
        stop.stopped_by = 2 if interrupt and stages[-1] == "pretrain" else None  # SIGINT
        return SimpleNamespace(trainer=SimpleNamespace(callbacks=[stop]))

    monkeypatch.setattr(splitlab.cli, "lightning_main", fake_fit)
    interrupt = True
    with pytest.raises(SystemExit) as stopped:
        run_pipeline(tmp_path, quiet=True)
    assert stopped.value.code == 130 and stages == ["pretrain"]
    assert not (tmp_path / "pretrain" / ".complete").exists()
    interrupt = False
    run_pipeline(tmp_path, quiet=True)
    assert stages == ["pretrain", "pretrain", "split"] and (tmp_path / "pretrain" / ".complete").exists()
    run_pipeline(tmp_path, quiet=True)  # finished now: only the SPLIT stage runs again
    assert stages[3:] == ["split"]


def test_a_demo_writes_only_into_a_folder_of_its_own(tmp_path, monkeypatch, capsys) -> None:
    """A fit's folder (no demo marker) and a demo of another policy are refused, naming what is there;
    a demo run again into its own folder replaces its own SPLIT stage, nothing else."""
    from types import SimpleNamespace

    import splitlab.cli

    fit = tmp_path / "fit"
    (fit / "checkpoints").mkdir(parents=True)
    (fit / "metrics.csv").write_text("epoch\n")
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(fit)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "holds files splitlab demo did not make (checkpoints, metrics.csv)" in err
    assert (fit / "metrics.csv").read_text() == "epoch\n"

    ours = tmp_path / "demo"
    finished_demo(ours)
    (ours / "pretrain" / ".complete").parent.mkdir(parents=True)
    (ours / "pretrain" / ".complete").write_text("")
    (ours / "predict").mkdir()  # a predict of the earlier run: not the demo's to remove
    (ours / "checkpoints").mkdir()
    (ours / "checkpoints" / "last.ckpt").write_text("old")

    def fake_fit(args):
        assert not (ours / "checkpoints").exists()  # the earlier SPLIT stage is gone before the new one
        (ours / "summary.json").write_text('{"trained_policy": "learned"}')
        return SimpleNamespace(trainer=SimpleNamespace(callbacks=[]))

    monkeypatch.setattr(splitlab.cli, "lightning_main", fake_fit)
    from splitlab.commands.demo import run_pipeline

    run_pipeline(ours, quiet=True)
    assert (ours / "predict").is_dir()
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(ours), "--policy", "entropy"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "a demo of --policy learned lives there, not --policy entropy" in err


@pytest.mark.parametrize("args", [["--policy", "transferred"], ["--policy-checkpoint", "runs/coco"]])
def test_a_transferred_demo_names_the_run_its_policy_comes_from(tmp_path, capsys, args) -> None:
    """``--policy transferred`` and ``--policy-checkpoint`` go together, refused in one line before
    anything is generated or trained."""
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(tmp_path / "demo"), "--task", "ade20k", *args])
    assert stop.value.code == 2
    assert "--policy transferred and --policy-checkpoint RUN go together" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("reach", ["split", "both"])
def test_overrides_reach_the_split_stage_or_both(tmp_path, monkeypatch, reach) -> None:
    """`splitlab demo --model.init_args.budget 0.3`: the SPLIT stage trains at that budget on the
    dense backbone as the twin trains it, or (``--overrides-reach both``) the dense stage takes it too."""
    from types import SimpleNamespace

    import splitlab.cli

    finished_demo(tmp_path / "demo")
    stages: dict[str, list[str]] = {}

    def fake_fit(args):
        stage = "pretrain" if any("version=pretrain" in a for a in args) else "split"
        stages[stage] = list(args)
        if stage == "split":
            raise Started
        return SimpleNamespace(trainer=SimpleNamespace(callbacks=[]))

    monkeypatch.setattr(splitlab.cli, "lightning_main", fake_fit)
    given = ["--model.init_args.budget", "0.3", "--trainer.max_epochs=1"]
    with pytest.raises(Started):
        main(["demo", "--out", str(tmp_path / "demo"), "--overrides-reach", reach, *given])
    wanted = ["--model.init_args.budget=0.3", "--trainer.max_epochs=1"]
    assert all(w in stages["split"] for w in wanted)
    assert all(w in stages["pretrain"] for w in wanted) == (reach == "both")
    # the SPLIT stage's overrides come after every --config, so no recipe resets them
    last_config = max(i for i, a in enumerate(stages["split"]) if a == "--config")
    assert min(stages["split"].index(w) for w in wanted) > last_config


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--budget=0.3"],
            "unknown arguments ['--budget=0.3']: only --config, --data.*, --model.*, --trainer.* overrides",
        ),
        (
            ["--overrides-reach", "both", "--model.init_args.budget=0.3"],
            "holds a finished dense backbone, which this demo would reuse as it was trained",
        ),
    ],
    ids=["not-an-override", "both-onto-a-trained-backbone"],
)
def test_overrides_that_cannot_be_passed_on_are_refused(tmp_path, capsys, argv, message) -> None:
    finished_demo(tmp_path / "demo")
    (tmp_path / "demo" / "pretrain").mkdir()
    (tmp_path / "demo" / "pretrain" / ".complete").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(tmp_path / "demo"), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_heldout_set_is_refused_where_the_twin_has_none(tmp_path, capsys) -> None:
    """VQA's and the multi-task twin's data have no split to grow: refused in one line, nothing made."""
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(tmp_path / "demo"), "--task", "vqa", "--heldout", "10"])
    assert stop.value.code == 2
    assert "--heldout 10: --task vqa has no held-out set (only classification, coco, ade20k)" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "demo").exists()


def test_a_heldout_set_is_the_generator_under_another_seed_made_once(tmp_path) -> None:
    """``count`` validation images per class from seed 100 + the data's seed (none of the twin's own
    images), kept for a second run of the same settings and made again for others."""
    from splitlab.commands.demo import generate_heldout
    from splitlab.data import generate_shapes

    own = generate_shapes(tmp_path / "own", train=1, val=3, test=1, seed=0, difficulty="hard")
    held = generate_heldout(tmp_path / "held", "classification", 3, seed=0, difficulty="hard")
    files = sorted((held / "val").rglob("*.png"))
    classes = {f.parent.name for f in files}
    assert len(classes) == 6 and len(files) == 3 * len(classes)
    mine = {f.read_bytes() for f in (own / "val").rglob("*.png")}
    assert not mine & {f.read_bytes() for f in files}
    again = generate_shapes(tmp_path / "again", train=1, val=3, test=1, seed=100, difficulty="hard")
    assert [f.read_bytes() for f in sorted((again / "val").rglob("*.png"))] == [f.read_bytes() for f in files]
    stamp = files[0].stat().st_mtime_ns
    generate_heldout(tmp_path / "held", "classification", 3, seed=0, difficulty="hard")
    assert files[0].stat().st_mtime_ns == stamp  # the same settings: kept
    generate_heldout(tmp_path / "held", "classification", 2, seed=0, difficulty="hard")
    assert len(list((held / "val").rglob("*.png"))) == 2 * 6  # another count: made again


def test_a_heldout_score_validates_the_run_on_the_new_set(tmp_path, monkeypatch, capsys) -> None:
    """After the SPLIT stage the run's own config and last checkpoint are validated on the held-out set,
    written under OUT/heldout (the run's summary untouched), and its table printed."""
    from types import SimpleNamespace

    import splitlab.cli

    out = tmp_path / "demo"
    finished_demo(out, seed=2)
    (out / "pretrain" / ".complete").parent.mkdir(parents=True)
    (out / "pretrain" / ".complete").write_text("")
    (out / "heldout").mkdir()
    (out / "heldout" / "stale.txt").write_text("an earlier run's")
    calls = []
    row = {"metric": 0.5, "token_fraction_mean": 0.3, "token_fraction_std": 0.1, "images_per_second": 1.0}

    def fake_main(args):
        calls.append(list(args))
        record = {"task": "classification", "metric": "top1", "budget": 0.3, "lambda": 0.0}
        if args[0] == "fit":
            (out / "checkpoints").mkdir()
            (out / "checkpoints" / "last.ckpt").write_text("")
            (out / "config.yaml").write_text("")
            folder, record = out, {**record, "stage": "fit", "policies": {"learned": row}}
        else:
            assert not (out / "heldout").exists()  # the earlier scores are gone before the new ones
            folder, record = out / "heldout", {**record, "stage": "validate", "policies": {"learned": row}}
        folder.mkdir(exist_ok=True)
        (folder / "summary.json").write_text(json.dumps(record))
        return SimpleNamespace(trainer=SimpleNamespace(callbacks=[]))

    monkeypatch.setattr(splitlab.cli, "lightning_main", fake_main)
    with pytest.raises(SystemExit) as done:
        main(["demo", "--out", str(out), "--seed", "2", "--heldout", "2"])
    assert done.value.code == 0
    validate = calls[-1]
    assert validate[:3] == ["validate", "--config", str(out / "config.yaml")]
    assert f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}" in validate
    assert f"--data.init_args.root={out / 'heldout-data'}" in validate
    assert "--trainer.logger.init_args.version=heldout" in validate
    made = json.loads((out / "heldout-data" / ".complete").read_text())
    assert made["seed"] == 102 and made["count"] == 2
    assert json.loads((out / "summary.json").read_text())["stage"] == "fit"
    written = json.loads((out / "heldout" / "summary.json").read_text())
    assert written["stage"] == "held-out, 2 per class" and written["heldout"] == made
    printed = capsys.readouterr().out
    assert "classification (held-out, 2 per class, trained policy: learned)" in printed
    assert f"held-out summary: {out / 'heldout' / 'summary.json'}" in printed
