"""``splitlab predict`` refuses what it cannot serve before it writes, writes its outputs only when
whole (a failed run blocks no rerun), and counts every input it cannot read, links that lead nowhere
included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from splitlab.commands import main
from splitlab.commands import predict as command
from tests.model.helpers import tiny_model

CAP_UNDER_BUDGET = (
    "max_fraction=0.2 is below budget=0.5: a cap under the budget holds every image below it, so the budget "
    "cannot be met; raise max_fraction to at least budget (or lower budget)"
)


@pytest.fixture
def model_and_files(tmp_path):
    """A saved tiny classifier (budget 0.5) and a folder of three images."""
    tiny_model("classification").save_pretrained(tmp_path / "model")
    folder = tmp_path / "inputs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png", "c.jpg"):
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(folder / name)
    return str(tmp_path / "model"), folder


def predict(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main(["predict", *argv, "--num-workers", "0"])
    captured = capsys.readouterr()
    return stop.value.code, captured.out, captured.err


def test_a_cap_below_the_budget_is_refused_before_anything_is_written(
    model_and_files, tmp_path, capsys
) -> None:
    model, files = model_and_files
    out = tmp_path / "out"
    code, _, err = predict(capsys, model, str(files), "--out", str(out), "--max-fraction", "0.2")
    assert code == 2 and err.strip() == f"splitlab: error: {CAP_UNDER_BUDGET}"
    assert not list(out.iterdir())  # nothing there to block the corrected run
    code, said, _ = predict(capsys, model, str(files), "--out", str(out), "--max-fraction", "0.5")
    assert code == 0 and "predicted 3 image(s)" in said
    code, _, err = predict(capsys, model, str(files), "--out", str(tmp_path / "o3"), "--budget", "0.95")
    assert code == 2 and err.strip() == (
        "splitlab: error: budget=0.95: this policy was trained for budgets [0.3, 0.7] (a budget-conditioned "
        "policy); pick a budget from 0.3 to 0.7, or retrain with a range that holds 0.95 "
        "(model.init_args.budget_range: [lowest, highest])"
    )
    # the model's own cap against the budget given per call; a comparison policy is not bound by it
    capped = tmp_path / "capped"
    tiny_model("classification", max_fraction=0.5).save_pretrained(capped)
    code, _, err = predict(capsys, str(capped), str(files), "--out", str(tmp_path / "o2"), "--budget", "0.6")
    assert code == 2 and "error: max_fraction=0.5 is below budget=0.6: a cap under the budget" in err
    code, _, err = predict(
        capsys,
        str(capped),
        str(files),
        "--out",
        str(tmp_path / "o2"),
        "--budget",
        "0.6",
        "--policy",
        "random",
    )
    assert code == 0, err


def test_a_failed_run_leaves_nothing_that_blocks_the_rerun(
    model_and_files, tmp_path, capsys, monkeypatch
) -> None:
    model, files = model_and_files
    out = tmp_path / "out"
    add = command.Outputs.add

    def full_disk_after_one(self, *args, **kwargs):
        if self.predicted:
            raise OSError(28, "No space left on device")
        add(self, *args, **kwargs)

    monkeypatch.setattr(command.Outputs, "add", full_disk_after_one)
    stopped_after_one = r"predict stopped after 1 image\(s\): their rows are in .*\.partial"
    with pytest.warns(UserWarning, match=stopped_after_one), pytest.raises(OSError, match="No space left"):
        predict(capsys, model, str(files), "--out", str(out), "--token-maps")
    assert sorted(p.name for p in out.iterdir()) == ["predictions.jsonl.partial"]  # the row it finished
    assert len((out / "predictions.jsonl.partial").read_text().splitlines()) == 1

    def stopped(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command.Outputs, "add", stopped)  # Ctrl-C before any row: nothing at all stays
    with pytest.raises(KeyboardInterrupt):
        predict(capsys, model, str(files), "--out", str(out))
    assert not list(out.iterdir())

    monkeypatch.undo()
    code, said, err = predict(capsys, model, str(files), "--out", str(out), "--token-maps")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["predictions.jsonl", "token_maps"]
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and len(list((out / "token_maps").glob("*.png"))) == 3
    assert "wrote predictions.jsonl, token_maps/" in said


def test_a_link_that_leads_nowhere_is_counted_and_named_as_skipped(model_and_files, tmp_path, capsys) -> None:
    model, files = model_and_files
    (files / "loop.png").symlink_to("loop.png")  # a link to itself
    (files / "gone.jpg").symlink_to(tmp_path / "deleted.jpg")
    out = tmp_path / "out"
    with pytest.warns(UserWarning) as said:
        code, printed, err = predict(capsys, model, str(files), "--out", str(out))
    assert code == 0, err
    skipped = sorted(str(w.message) for w in said if "skipping" in str(w.message))
    assert len(skipped) == 2
    assert skipped[0].startswith(f"skipping {files / 'gone.jpg'}: ")
    assert skipped[1].startswith(f"skipping {files / 'loop.png'}: ")
    assert "Too many levels of symbolic links" in skipped[1]
    assert "predicted 3 image(s), 2 skipped" in printed
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3
