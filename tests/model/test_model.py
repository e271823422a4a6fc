"""`SplitModel`: the deployed path of every task, its policies and cap, and the Hugging Face round trip."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import splitlab
from splitlab.model import SplitModel, load
from tests.model.helpers import images, tiny_model

TASKS = ("classification", "detection", "segmentation", "vqa")


def flat(outputs) -> list[torch.Tensor]:
    """Every tensor in a task's outputs (dicts, lists, nested)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        return [t for v in outputs.values() for t in flat(v)]
    if isinstance(outputs, list | tuple):
        return [t for v in outputs for t in flat(v)]
    return []


def test_importing_the_model_imports_no_lightning() -> None:
    code = (
        "import sys, splitlab, splitlab.model; splitlab.load; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'torchmetrics')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("task", TASKS)
def test_save_pretrained_round_trip_is_bit_identical(task, tmp_path) -> None:
    model = tiny_model(task, tmp_path)
    x = images()
    with torch.no_grad():
        out, layout = model(x, budget=0.4)
    model.save_pretrained(tmp_path / "saved")
    assert {p.name for p in (tmp_path / "saved").iterdir()} >= {"config.json", "model.safetensors"}
    again = SplitModel.from_pretrained(tmp_path / "saved")
    assert type(again) is type(model) and not again.training
    assert again.names == model.names and again.preprocessing == model.preprocessing
    with torch.no_grad():
        out2, layout2 = again(x, budget=0.4)
    assert layout2.seqlens == layout.seqlens and torch.equal(layout2.boxes, layout.boxes)
    assert all(torch.equal(a, b) for a, b in zip(flat(out), flat(out2), strict=True))
    assert torch.equal(layout2.tokens, layout.tokens)


def test_load_takes_a_save_pretrained_folder_and_refuses_what_it_cannot_read(tmp_path) -> None:
    model = tiny_model("classification")
    model.save_pretrained(tmp_path / "saved")
    assert isinstance(splitlab.load(tmp_path / "saved"), type(model))
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        load(tmp_path / "nothing" / "here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither config.json"):
        load(tmp_path / "empty")
    torch.save({"weights": 1}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not written by a splitlab task"):
        load(tmp_path / "other.ckpt")
    (tmp_path / "cut.ckpt").write_bytes(b"PK\x03\x04 not a whole file")
    with pytest.raises(ValueError, match="is not a readable checkpoint: truncated: 21 bytes"):
        load(tmp_path / "cut.ckpt")


def test_a_broken_config_and_a_file_in_the_way_are_one_line_each(tmp_path, capsys) -> None:
    """A saved model whose ``config.json`` was cut short (json's own error names no file), and
    ``save_pretrained`` onto a file (huggingface_hub's bare FileExistsError)."""
    from splitlab.commands import main

    model = tiny_model("classification")
    model.save_pretrained(tmp_path / "saved")
    config = tmp_path / "saved" / "config.json"
    text = config.read_text()
    fix = "copy it again from where the model came from, or save the model again"
    for broken, what in (
        (text[: text.index('"backbone"') + 4], "is not valid JSON (Unterminated string starting at: line "),
        ("", "is empty"),
        ("[1, 2]", "holds a JSON list, not a model's settings"),
    ):
        config.write_text(broken)
        with pytest.raises(ValueError, match="cut short|settings") as refused:
            load(tmp_path / "saved")
        assert str(refused.value).startswith(f"{config} {what}") and fix in str(refused.value)
    with pytest.raises(SystemExit) as stop:
        main(["export", str(tmp_path / "saved"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"splitlab: error: {config} holds a JSON list")
    assert err.count("\n") == 1
    (tmp_path / "file").write_text("not a folder")
    for target, blocking in (
        (tmp_path / "file", tmp_path / "file"),
        (tmp_path / "file" / "sub", tmp_path / "file"),
    ):
        with pytest.raises(FileExistsError) as refused:
            model.save_pretrained(target)
        assert str(refused.value) == (
            f"save_pretrained({str(target)!r}): {blocking} is a file, and a saved model is a folder "
            "(config.json + model.safetensors) at that path: give the path of a new or existing folder instead"
        )
    assert (tmp_path / "file").read_text() == "not a folder"


def test_policies_budgets_and_the_cap() -> None:
    model = tiny_model("classification")
    x = images(16)
    with torch.no_grad():
        uniform = model.layout(x, policy="uniform")
        low, high = model.layout(x, budget=0.3), model.layout(x, budget=0.7)
        random = model.layout(x, policy="random", budget=0.5)
        capped = model.layout(x, budget=0.4, max_fraction=0.4)
    assert float(uniform.fraction.min()) == 1.0
    assert float(low.fraction.mean()) < float(high.fraction.mean())  # the policy reads its budget
    assert abs(float(random.fraction.mean()) - 0.5) < 0.1
    assert float(capped.fraction.max()) <= 0.4 < float(high.fraction.max())
    with pytest.raises(ValueError, match=r"budget=0.9: this policy was trained for budgets \[0.3, 0.7\]"):
        model.layout(x, budget=0.9)
    with pytest.raises(ValueError, match="policy='best'"):
        model(x, policy="best")


def test_a_model_with_a_cap_caps_its_own_policy_not_comparison_rows() -> None:
    model = tiny_model("classification", max_fraction=0.4, budget=0.4)
    x = images(16)
    with torch.no_grad():
        deployed = model.layout(x)
        row = model.layout(x, budget=0.7, policy="random")  # a comparison row: the model's cap is not its
    assert float(deployed.fraction.max()) <= 0.4 < float(row.fraction.max())


CAP_UNDER_BUDGET = (
    "max_fraction=0.3 is below budget=0.5: a cap under the budget holds every image below it, so the budget "
    "cannot be met; raise max_fraction to at least budget (or lower budget)"
)


def test_a_cap_below_the_budget_is_refused_alike_on_every_path() -> None:
    """One line from one function (`SplitModel.check_cap`) wherever a cap under the budget is asked for:
    the layout, the forward pass, predict, the static path of every export, a changed deployment."""
    from splitlab.model.export import StaticSplit

    model = tiny_model("classification")  # deploys 0.5, conditioned on 0.3 ... 0.7
    x = images(4)
    calls = {
        "layout": lambda: model.layout(x, max_fraction=0.3),
        "forward": lambda: model(x, max_fraction=0.3),
        "predict": lambda: model.predict(x, max_fraction=0.3),
        "export": lambda: StaticSplit(model, max_fraction=0.3),
        "set_deployment": lambda: model.set_deployment(max_fraction=0.3),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as refused:
            call()
        assert str(refused.value) == CAP_UNDER_BUDGET, name
    assert model.max_tokens is None and model.budget == 0.5  # a refused deployment changes nothing
    with torch.no_grad():  # the budget given per call is the one the cap is held against
        assert float(model.layout(x, budget=0.3, max_fraction=0.3).fraction.max()) <= 0.3
        assert len(model.predict(x, budget=0.3, max_fraction=0.3)) == 4
    StaticSplit(model, budget=0.3, max_fraction=0.3)
    # a model's own cap binds its policy at any budget asked of it, not a comparison row; an explicit
    # cap binds every policy but uniform, which meets no budget (every patch split)
    capped = tiny_model("classification", max_fraction=0.5)
    under = "max_fraction=0.5 is below budget=0.7: a cap under the budget"
    for call in (
        lambda: capped(x, budget=0.7),
        lambda: capped.predict(x, budget=0.7),
        lambda: StaticSplit(capped, budget=0.7),
        lambda: capped.layout(x, budget=0.7, policy="random", max_fraction=0.5),
    ):
        with pytest.raises(ValueError, match=under):
            call()
    with torch.no_grad():
        capped.layout(x, budget=0.7, policy="random")
        assert float(capped.layout(x, policy="uniform", max_fraction=0.3).fraction.max()) <= 0.3


def test_a_checkpoint_of_a_task_loads_as_its_model(tmp_path) -> None:
    """What `splitlab.load` reads from a training checkpoint: the model config it records; a
    checkpoint that records none was not written by this splitlab version and is refused."""
    from splitlab.tasks import ClassificationTask
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, budget_range=[0.3, 0.7], **TINY).eval()
    torch.nn.init.normal_(task.model.tokenizer.decision.mlp.fc2.weight, std=1.0)

    def written(name: str, names: list[str]) -> dict:
        task.model.names = names
        checkpoint = {
            "state_dict": task.state_dict(),
            "hyper_parameters": dict(task.hparams),
            "pytorch-lightning_version": "2.6.0",
        }
        task.on_save_checkpoint(checkpoint)
        torch.save(checkpoint, tmp_path / name)
        return checkpoint

    written("older.ckpt", ["w", "x", "y", "z"])
    checkpoint = written("new.ckpt", ["a", "b", "c", "d"])
    x = images()
    with torch.no_grad():
        expected, layout = task(x)
        out, again = load(tmp_path / "new.ckpt")(x)
        assert torch.equal(out, expected) and again.seqlens == layout.seqlens
        resumed = ClassificationTask.load_from_checkpoint(tmp_path / "new.ckpt").eval()  # Lightning's way in
        assert torch.equal(resumed(x)[0], expected)
    assert load(tmp_path / "new.ckpt").names == ["a", "b", "c", "d"]
    run = tmp_path / "run" / "checkpoints"  # a run folder deploys its newest last*.ckpt
    run.mkdir(parents=True)
    (run / "last.ckpt").write_bytes((tmp_path / "older.ckpt").read_bytes())
    (run / "last-v1.ckpt").write_bytes((tmp_path / "new.ckpt").read_bytes())
    os.utime(run / "last.ckpt", (1, 1))
    assert load(run.parent).names == ["a", "b", "c", "d"]
    del checkpoint["splitlab"]["model"]  # as written before the model recorded its config
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with pytest.raises(ValueError) as refused:
        load(tmp_path / "old.ckpt")
    assert str(refused.value) == (
        f"model={str(tmp_path / 'old.ckpt')!r} records no model config (splitlab.model): it was not written "
        f"by this splitlab version ({splitlab.__version__})"
    )


def test_a_file_from_before_apt_budget_was_named_so_loads_its_apt_budget() -> None:
    """APT's budget was saved as ``apt_fraction`` (a budget, not a fraction of anything measured):
    older checkpoints and saved models keep that name, and load it as ``apt_budget``."""
    model = tiny_model("classification")
    state = model.state_dict()
    state["apt_fraction"] = torch.tensor(0.4)
    del state["apt_budget"]
    model.load_state_dict(state)
    assert model.apt_ready(0.4) and float(model.apt_budget) == pytest.approx(0.4)
