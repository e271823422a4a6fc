"""The simple feature pyramid on packed features: uniform equivalence, coarse cells, strides and refusals."""

from __future__ import annotations

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.heads import (
    SimpleFeaturePyramid,
    check_pyramid_grid,
    pyramid_grids,
    pyramid_scales,
)
from splitlab.tokenizer import SplitTokenizer
from tests.helpers import layout_of


def test_pyramid_of_a_uniform_layout_equals_the_dense_model() -> None:
    backbone = PackedViT("vit_tiny_patch16_224", img_size=128, depth=4).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (64, 32, 16)).eval()
    pyramid = SimpleFeaturePyramid(backbone.embed_dim, 32, num_inputs=4, scales=pyramid_scales(16)).eval()
    x = torch.randn(3, 3, 128, 128)
    with torch.no_grad():
        features = backbone(layout_of("uniform", tokenizer, backbone, x), indices=[0, 1, 2, 3])
        packed = pyramid(pyramid_grids(features))
        _, dense = backbone.model.forward_intermediates(
            x, indices=[0, 1, 2, 3], norm=False, output_fmt="NCHW"
        )
        reference = pyramid(dense)
    assert [tuple(v.shape[-2:]) for v in packed.values()] == [
        (32, 32),
        (16, 16),
        (8, 8),
        (4, 4),
    ]  # strides 4..32
    for key in packed:
        assert (packed[key] - reference[key]).abs().max().item() <= 1e-4


def test_all_coarse_grid_is_constant_over_each_coarse_cell() -> None:
    backbone = PackedViT("vit_tiny_patch16_224", img_size=128, depth=2).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (64, 32, 16)).eval()
    with torch.no_grad():
        features = backbone(layout_of("coarse", tokenizer, backbone, torch.randn(2, 3, 128, 128)), indices=1)
    grid = pyramid_grids(features)[0]  # (B, D, 8, 8); coarse cells are 4x4
    cells = grid.reshape(2, -1, 2, 4, 2, 4)
    assert torch.equal(cells, cells[:, :, :, :1, :, :1].expand_as(cells))
    assert not torch.equal(cells[:, :, 0, 0], cells[:, :, 1, 1])  # different cells differ


def test_pyramid_strides_and_refusals() -> None:
    assert pyramid_scales(16) == (4.0, 2.0, 1.0, 0.5)
    assert pyramid_scales(8) == (2.0, 1.0, 0.5, 0.25)
    assert pyramid_scales(14) == (4.0, 2.0, 1.0, 0.5)  # strides 3.5 .. 28
    with pytest.raises(ValueError, match="image size 120x120 gives a 15x15 patch grid"):
        check_pyramid_grid((120, 120), 8, pyramid_scales(8))
    check_pyramid_grid((128, 128), 8, pyramid_scales(8))


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([3, 2, 1, 0], r"list the blocks shallow to deep \(blocks \[3, 2, 1, 0\]\), finest level first"),
        ([-1, 0, 1, 2], r"list the blocks shallow to deep \(blocks \[3, 0, 1, 2\]\)"),
        ([0, 1, 1, 3], "each pyramid level needs its own block"),
        ([0, 1, 2, 9], r"block\(s\) \[9\] out of range"),
    ],
)
def test_pyramid_indices_refusals(indices, message) -> None:
    """The backbone returns block outputs in block order: any other order would feed a level the
    wrong block, so it is refused by name (negative indices count from the end)."""
    backbone = PackedViT("test_vit", img_size=64, patch_size=8, depth=4)
    with pytest.raises(ValueError, match=message):
        SimpleFeaturePyramid.for_backbone(backbone, 16, indices)
    assert SimpleFeaturePyramid.for_backbone(backbone, 16, [0, 1, -2, -1]).indices == [0, 1, 2, 3]
