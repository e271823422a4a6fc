"""Shared fixtures: tiny random-init backbones and tokenizers (no downloads, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.tokenizer import SplitTokenizer, baseline_scores


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny_vit() -> PackedViT:
    """A 2-block, width-64 ViT/16 at 64 px (test_vit shrunk), eval mode."""
    return PackedViT("test_vit", img_size=64, depth=2).eval()


@pytest.fixture
def tiny_tokenizer(tiny_vit: PackedViT) -> SplitTokenizer:
    """Levels (64, 32, 16) on the tiny ViT, with a non-trivial decision module."""
    tok = SplitTokenizer(tiny_vit.embed_dim, (64, 32, 16), decision_dim=32, decision_heads=2).eval()
    torch.nn.init.normal_(tok.decision.mlp.fc2.weight, std=1.0)
    return tok


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory: pytest.TempPathFactory):
    """A tiny generated ImageFolder set (6 train, 3 val, 3 test images per class, 64 px)."""
    from splitlab.data import generate_shapes

    return generate_shapes(tmp_path_factory.mktemp("shapes"), train=6, val=3, test=3, seed=1)


def tiny_args(root, log_dir, *extra: str) -> list[str]:
    """CLI arguments of the CI classification twin, shrunk further for unit tests."""
    from splitlab.tools import ci_recipe

    return [
        *ci_recipe(),
        f"--data.init_args.root={root}",
        "--data.init_args.batch_size=8",
        f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.logger.init_args.name=",
        "--trainer.logger.init_args.version=",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.backbone_kwargs.embed_dim=32",
        "--model.init_args.backbone_kwargs.depth=2",
        "--model.init_args.backbone_kwargs.num_heads=2",
        "--model.init_args.decision_dim=16",
        "--model.init_args.decision_heads=2",
        "--model.init_args.ppo.samples=2",
        "--model.init_args.ppo.epochs=2",
        *extra,
    ]


def schedule_args(warm: int, rl: int, dense: int = 0) -> list[str]:
    """Override the trainer's callbacks: this schedule, pictures, and a checkpoint every epoch."""
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": warm, "rl_epochs": rl, "dense_epochs": dense},
        },
        {"class_path": "splitlab.callbacks.TokenMapPictures"},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "save_top_k": -1},
        },
    ]
    return [f"--trainer.max_epochs={dense + warm + rl}", f"--trainer.callbacks={json.dumps(callbacks)}"]


def layout_of(name: str, tokenizer, backbone, images, **kwargs):
    """A baseline layout (``uniform``, ``coarse``, ``random``, ``entropy``) through the tokenizer."""
    scores, threshold = baseline_scores(name, images, tokenizer.levels, **kwargs)
    return tokenizer(images, backbone, mode="scores", scores=scores, threshold=threshold)
