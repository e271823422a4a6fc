"""`SegmentationHead`: any mmseg decode head on the pyramid, refusals that name the setting."""

from __future__ import annotations

import pytest
import torch

from splitlab.heads import SegmentationHead
from splitlab.heads.pyramid import SimpleFeaturePyramid


@pytest.fixture
def pyramid(tiny_vit) -> SimpleFeaturePyramid:
    return SimpleFeaturePyramid.for_backbone(tiny_vit, out_channels=16, indices=[1])


@pytest.mark.parametrize(
    ("decode_head", "auxiliary_head"),
    [
        (None, {}),  # UPerHead + FCN auxiliary, the recipe's
        ({"type": "FCNHead", "channels": 32}, None),  # one input: the levels resized and concatenated
        (
            {"type": "ASPPHead", "channels": 32, "dilations": (1, 6)},
            {"type": "ASPPHead", "dilations": (1, 2)},
        ),
        ({"type": "SegformerHead", "channels": 32}, None),  # reads every level itself
        ({"type": "FCNHead", "in_index": 0}, None),  # one level, as given
    ],
)
def test_any_mmseg_head_builds_and_predicts_at_stride_4(pyramid, decode_head, auxiliary_head) -> None:
    head = SegmentationHead(pyramid, num_classes=5, decode_head=decode_head, auxiliary_head=auxiliary_head)
    inputs = [torch.randn(2, 16, 16 >> i, 16 >> i) for i in range(4)]
    assert head.decode(inputs).shape == (2, 5, 16, 16)
    if auxiliary_head is not None:
        assert head.aux(inputs).shape[:2] == (2, 5)


def test_a_head_mmseg_cannot_build_names_the_setting(pyramid) -> None:
    with pytest.raises(
        ValueError,
        match=r"model.init_args.decode_head: mmseg cannot build a FCNHead from it: .* keyword argument 'pool_scales'",
    ):
        SegmentationHead(pyramid, num_classes=5, decode_head={"type": "FCNHead", "pool_scales": (1, 2)})


def test_without_compiled_ops_mmcv_ops_is_a_stand_in_that_names_the_fix() -> None:
    """mmcv-lite has no compiled ops: `import_mmseg` gives mmseg the pure-Python ``point_sample``
    (a bilinear sample at normalised points) and a clear error for any compiled op."""
    import sys

    from splitlab.heads.mmseg import import_mmseg

    import_mmseg()
    ops = sys.modules["mmcv.ops"]
    if not getattr(ops, "__file__", "").endswith("heads/mmseg.py"):
        pytest.skip("a full mmcv with compiled ops is installed: used as is")
    grid = torch.arange(16.0).view(1, 1, 4, 4)
    centre = ops.point_sample(grid, torch.tensor([[[0.125, 0.125], [0.875, 0.375]]]), align_corners=False)
    assert centre.flatten().tolist() == pytest.approx([0.0, 7.0])  # the centres of cells (0, 0) and (1, 3)
    with pytest.raises(NotImplementedError, match=r"mmcv.ops.roi_align needs mmcv's compiled ops.*UPerHead"):
        ops.roi_align(grid)
