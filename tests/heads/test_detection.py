"""`DetectionHead` on its own (no task): reference proposals, per-image losses, bf16 decoding."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from splitlab.heads import DetectionHead, reference_proposals
from splitlab.heads.pyramid import SimpleFeaturePyramid


@pytest.fixture
def head(tiny_vit) -> DetectionHead:
    """Faster R-CNN heads on the tiny ViT's pyramid (64 px input, strides 4-32)."""
    pyramid = SimpleFeaturePyramid.for_backbone(tiny_vit, out_channels=16, indices=[1])
    return DetectionHead(pyramid, 3, (64, 64), {"anchor_sizes": (8, 16, 32, 64), "representation_size": 32})


def _outputs(batch: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    gen = torch.Generator().manual_seed(seed)
    features = OrderedDict(
        (str(i), torch.randn(batch, 16, 16 >> i, 16 >> i, generator=gen).to(dtype)) for i in range(4)
    )
    return {"features": features, "image_sizes": [(64, 64)] * batch}


def _target(*boxes: list[float]) -> dict[str, torch.Tensor]:
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.ones(len(boxes), dtype=torch.int64),
    }


def test_reference_proposals_keep_the_truth_and_stay_inside_the_image() -> None:
    torch.manual_seed(0)
    truth = torch.tensor([[10.0, 10.0, 30.0, 40.0], [40.0, 0.0, 64.0, 20.0]])
    props = reference_proposals(truth, (48, 64), jitter=8, background=32)
    assert torch.equal(props[:2], truth)  # the ground truth itself is always a proposal
    assert props.shape[0] <= 2 + 2 * 8 + 32 and props.shape[0] > 2 + 2 * 8  # few random boxes dropped
    assert (props[:, 0::2] >= 0).all() and (props[:, 0::2] <= 64).all()
    assert (props[:, 1::2] >= 0).all() and (props[:, 1::2] <= 48).all()
    assert ((props[:, 2:] - props[:, :2]) >= 1).all()
    empty = reference_proposals(torch.zeros(0, 4), (48, 64), background=5)
    assert empty.shape[1] == 4 and 0 < empty.shape[0] <= 5  # an image without objects: background boxes only


@pytest.mark.parametrize("reference", [False, True])
def test_per_image_loss_depends_on_the_image_and_its_seed_only(head, reference) -> None:
    """Rows with the same features and seed get the same loss wherever they sit in the batch (PPO's
    rollouts of one image); another seed draws other samples; the global RNG is left as it was."""
    outputs = _outputs(3)
    targets = [_target([8, 8, 40, 40]), _target([0, 0, 20, 30], [30, 30, 60, 60]), _target([16, 4, 48, 36])]
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    loss = head.per_image_loss(outputs, targets, seeds=[5, 6, 7], reference=reference)
    assert torch.equal(torch.rand(1), before)  # the samplers' draws came from a forked stream
    assert loss.shape == (3,) and torch.isfinite(loss).all()
    swapped = {
        "features": OrderedDict((k, v[[2, 1, 0]]) for k, v in outputs["features"].items()),
        "image_sizes": outputs["image_sizes"],
    }
    again = head.per_image_loss(swapped, targets[::-1], seeds=[7, 6, 5], reference=reference)
    assert torch.allclose(again, loss.flip(0), atol=1e-6)
    reseeded = head.per_image_loss(outputs, targets, seeds=[5, 6, 8], reference=reference)
    assert torch.allclose(reseeded[:2], loss[:2], atol=1e-6) and not torch.allclose(reseeded[2], loss[2])


def test_boxes_are_decoded_in_float32_under_bf16_autocast(head) -> None:
    """The recipes' bf16-mixed: the heads run in float32 on the (bf16) pyramid, so boxes come out as
    they do from the same pyramid without autocast (in bf16 they stepped by 4 px at 1024)."""
    head.eval()
    outputs = _outputs(2, dtype=torch.bfloat16)
    with torch.no_grad():
        plain = head.detect(
            {**outputs, "features": OrderedDict((k, v.float()) for k, v in outputs["features"].items())}
        )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = head.detect(outputs)
    assert sum(len(d["boxes"]) for d in plain) > 0
    for got, want in zip(mixed, plain, strict=True):
        assert got["boxes"].dtype == torch.float32 and torch.equal(got["boxes"], want["boxes"])


def test_detector_settings_are_checked_and_read_from_a_mapping() -> None:
    from splitlab.heads import DetectorSettings

    with pytest.raises(
        ValueError, match=r"detector.name='retinanet': expected one of \['faster_rcnn', 'mask_rcnn'\]"
    ):
        DetectorSettings(name="retinanet")
    settings = DetectorSettings(anchor_sizes=[8, 16], aspect_ratios=[1], torchvision_kwargs=None)
    assert settings.anchor_sizes == (8, 16) and settings.aspect_ratios == (1.0,)
    assert settings.torchvision_kwargs == {}
