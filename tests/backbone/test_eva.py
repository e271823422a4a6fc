"""EVA-02 through the packed backbone: a packed batch equals each image alone."""

from __future__ import annotations

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.tokenizer import Levels, SplitTokenizer
from tests.helpers import layout_of


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("eva02_tiny_patch14_224", {"img_size": 112, "depth": 2}),
        ("eva02_base_patch16_clip_224", {"img_size": 128, "depth": 2}),
        ("eva02_small_patch14_224", {"img_size": 112, "depth": 2, "num_classes": 10}),
    ],
)
def test_eva02_packed_batch_equals_each_image_alone(name, kwargs) -> None:
    backbone = PackedViT(name, **kwargs).eval()
    tokenizer = SplitTokenizer(
        backbone.embed_dim, Levels.default(backbone.patch_size, backbone.img_size)
    ).eval()
    x = torch.randn(3, 3, *backbone.img_size)
    with torch.no_grad():
        mixed = layout_of(
            "random", tokenizer, backbone, x, budget=0.5, generator=torch.Generator().manual_seed(0)
        )
        batch = backbone(mixed).per_image()
        assert len(set(mixed.seqlens)) > 1
        for i in range(3):
            labels = [d[i : i + 1] for d in mixed.decisions]
            alone = backbone(tokenizer(x[i : i + 1], backbone, mode="labels", labels=labels))
            assert (alone.per_image()[0] - batch[i]).abs().max().item() <= 1e-4
