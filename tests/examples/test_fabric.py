"""examples/fabric.py: Lightning Fabric drives the plain loop's own steps, and on one device trains
exactly what the plain loop trains."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from lightning.fabric import Fabric

import splitlab
from tests.examples.test_plain_pytorch import load_example

FABRIC = Path(__file__).resolve().parents[2] / "examples" / "fabric.py"


def test_fabric_trains_the_plain_loops_weights_and_saves_a_model_that_predicts(shapes_root, tmp_path) -> None:
    plain = load_example()
    plain_model, _ = plain.train(shapes_root, tmp_path / "plain", warm_steps=3, ppo_steps=3)
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    fabric.launch()
    model, calibrated = plain.train(
        shapes_root, tmp_path / "fabric", warm_steps=3, ppo_steps=3, fabric=fabric
    )
    mine, theirs = model.state_dict(), plain_model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert abs(calibrated.after - 0.5) < 0.03
    files = sorted((shapes_root / "test").rglob("*.png"))[:4]
    assert splitlab.load(tmp_path / "fabric").predict(files) == plain_model.predict(files)


def test_the_fabric_example_runs_from_its_command_line(shapes_root, tmp_path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("fabric_example", FABRIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = [
        "fabric.py",
        "--data",
        str(shapes_root),
        "--out",
        str(tmp_path / "m"),
        "--warm-steps",
        "2",
        "--ppo-steps",
        "2",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    module.main()
    assert (tmp_path / "m" / "config.json").is_file()
