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
    monkeypatch.setattr(splitlab.cli, "lightning_main", started)
    with pytest.raises(Started):
        main(["demo", *(a.format(base=base, tmp=tmp_path) for a in argv)])
