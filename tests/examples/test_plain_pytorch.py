"""examples/plain_pytorch.py: SPLIT trained by a plain PyTorch loop (no Lightning) saves a model that
`splitlab.load` reads and predicts with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import splitlab

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plain_pytorch.py"


def load_example():
    spec = importlib.util.spec_from_file_location("plain_pytorch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plain_loop_trains_both_stages_and_saves_a_model_that_predicts(shapes_root, tmp_path) -> None:
    example = load_example()
    torch.manual_seed(0)
    untrained = {k: v.clone() for k, v in example.SplitModel.from_timm(
        example.timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, embed_dim=64, depth=2,
                                  num_heads=2, num_classes=4),
        levels=[32, 16, 8], decision_dim=32, decision_heads=2,
    ).state_dict().items()}  # fmt: skip
    model, calibrated = example.train(shapes_root, tmp_path / "model", warm_steps=3, ppo_steps=3)
    trained = model.state_dict()
    moved = {k for k, v in untrained.items() if not torch.equal(v, trained[k])}
    assert any(k.startswith("tokenizer.decision.") for k in moved)  # the policy learned
    assert any(k.startswith("backbone.") for k in moved)  # the warm start fine-tuned the backbone
    assert calibrated.images == 24 and abs(calibrated.after - 0.5) < 0.03

    loaded = splitlab.load(tmp_path / "model")
    files = sorted((shapes_root / "test").rglob("*.png"))
    predictions = loaded.predict(files)
    assert len(predictions) == len(files) and {p["class"] for p in predictions} <= set(loaded.names)
    assert loaded.names == sorted(p.name for p in (shapes_root / "train").iterdir() if p.is_dir())
    assert predictions == model.predict(files)  # saved and loaded exactly
