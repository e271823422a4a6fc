"""Shared fixtures: tiny random-init backbones and tokenizers, a tiny generated dataset (no downloads, CPU).

Helpers that tests import live in `tests.helpers`."""

from __future__ import annotations

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.tokenizer import SplitTokenizer


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
