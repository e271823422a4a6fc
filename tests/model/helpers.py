"""Tiny `SplitModel`s of every task, random init, built from their configs (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from splitlab.model import SplitModel

BASE = {
    "backbone": "vit_tiny_patch16_224",
    "backbone_kwargs": {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
    "levels": [32, 16, 8],
    "budget": 0.5,
    "budget_points": [0.3, 0.4, 0.5, 0.6, 0.7],
    "decision_dim": 16,
    "decision_heads": 2,
}
HEADS = {
    "classification": {"num_classes": 4},
    "detection": {
        "num_classes": 3,
        "pyramid_channels": 16,
        "pyramid_indices": [1],
        "detector": {"anchor_sizes": [8, 16, 32, 64], "representation_size": 32},
        "category_ids": [1, 5, 9],
    },
    "segmentation": {
        "num_classes": 5,
        "pyramid_channels": 16,
        "pyramid_indices": [1],
        "decode_head": {"channels": 16},
    },
}
NAMES = {
    "classification": ["circle", "square", "stripes", "checks"],
    "detection": ["cat", "dog", "bird"],
    "segmentation": [f"class{i}" for i in range(5)],
}


def vqa_head(folder: Path) -> dict:
    from tests.heads.test_vqa import LM, WORDS

    vocab = folder / "vocab.json"
    vocab.write_text(json.dumps(WORDS))
    return {"lm": LM, "lm_tokenizer": str(vocab), "prompt": "<image> {question}", "max_new_tokens": 3}


def tiny_model(task: str, folder: Path | None = None, **settings) -> SplitModel:
    """A tiny model of ``task`` whose decision module splits unevenly (layouts differ per image)."""
    head = vqa_head(folder) if task == "vqa" else dict(HEADS[task])
    config = {**BASE, "task": task, "head": head, "names": NAMES.get(task), **settings}
    torch.manual_seed(0)
    model = SplitModel.from_config(config).eval()
    torch.nn.init.normal_(model.tokenizer.decision.mlp.fc2.weight, std=1.0)
    with torch.no_grad():  # as a trained policy would be: a calibrated cut per budget point
        points = model.tokenizer.operating_points
        points.cuts.copy_(torch.linspace(0.4, -0.4, 5))
        points.counts.fill_(1)
        tokens, _ = model.tokenizer.embed(images(16, seed=1), model.backbone)  # and its spread: a cap
        for point, budget in enumerate(points.budgets.tolist()):  # meets the budget too
            points.record_spread(point, model.tokenizer.decision_logits(tokens, budget))
    return model


def images(count: int = 4, seed: int = 0) -> torch.Tensor:
    """``count`` normalised 64 px images."""
    return torch.randn(count, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
