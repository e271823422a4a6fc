"""`SplitMultiTask`: several heads on one backbone pass, saved and loaded whole."""

from __future__ import annotations

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.model import SplitModel, SplitMultiTask

TASKS = {
    "coco": {
        "task": "detection",
        "num_classes": 3,
        "pyramid_channels": 16,
        "pyramid_indices": [1],
        "detector": {"anchor_sizes": [16, 32, 64, 128], "representation_size": 32},
        "names": ["a", "b", "c"],
    },
    "ade20k": {
        "task": "segmentation",
        "num_classes": 5,
        "pyramid_channels": 16,
        "pyramid_indices": [0],
        "decode_head": {"channels": 16},
        "auxiliary_head": None,
    },
}


def multitask(**overrides) -> SplitMultiTask:
    config = {
        "task": "multitask",
        "backbone": "vit_tiny_patch16_224",
        "backbone_kwargs": {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
        "levels": [32, 16, 8],
        "budget": 0.5,
        "decision_dim": 16,
        "decision_heads": 2,
        "head": {"tasks": TASKS},
        **overrides,
    }
    torch.manual_seed(0)
    model = SplitModel.from_config(config).eval()
    torch.nn.init.normal_(model.tokenizer.decision.mlp.fc2.weight, std=1.0)
    return model


def test_every_head_reads_one_backbone_pass(monkeypatch) -> None:
    model = multitask()
    passes = []
    forward = PackedViT.forward
    monkeypatch.setattr(
        PackedViT, "forward", lambda self, *a, **k: passes.append(1) or forward(self, *a, **k)
    )
    images = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        outputs, layout = model(images)
    assert len(passes) == 1 and set(outputs) == {"coco", "ade20k"}
    assert outputs["ade20k"]["logits"].shape[0] == 3 and len(outputs["coco"]["image_sizes"]) == 3
    # each head's outputs are its own task model's on the same features (its blocks of the one pass)
    with torch.no_grad():
        features = model.backbone(layout, indices=model.backbone_indices())
        own = model.members["ade20k"]
        blocks = [features.intermediates[model.backbone_indices().index(i)] for i in own.backbone_indices()]
        features.intermediates = blocks
        assert torch.equal(own.forward_task(features)["logits"], outputs["ade20k"]["logits"])


def test_a_head_given_its_images_reads_those_alone() -> None:
    """In training each head reads its own task's images: the same outputs as on those images alone."""
    model = multitask()
    model.head["ade20k"].train(False)
    images = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        layout = model.layout(images)
        some = model.forward_layout(layout, {"ade20k": [1, 3]})
        alone = model.forward_layout(model.layout(images[[1, 3]]))
    assert set(some) == {"ade20k"}
    torch.testing.assert_close(some["ade20k"]["logits"], alone["ade20k"]["logits"])


def test_save_and_load_round_trip_exactly(tmp_path) -> None:
    model = multitask()
    model.set_member_data("ade20k", ["sky", "wall", "x", "y", "z"], None)
    model.save_pretrained(tmp_path)
    again = SplitModel.from_pretrained(tmp_path).eval()
    assert isinstance(again, SplitMultiTask) and again.members["ade20k"].names[:2] == ["sky", "wall"]
    assert again.members["coco"].names == ["a", "b", "c"]
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        (a, la), (b, lb) = model(images), again(images)
    assert torch.equal(la.fraction, lb.fraction)
    assert torch.equal(a["ade20k"]["logits"], b["ade20k"]["logits"])
    for key in a["coco"]["features"]:
        assert torch.equal(a["coco"]["features"][key], b["coco"]["features"][key])
    # the shared parts are saved once: no member holds a copy of the backbone
    assert not [k for k in model.state_dict() if ".backbone." in k and k.startswith("head.")]


def test_predict_gives_every_task_per_image(tmp_path) -> None:
    from PIL import Image

    model = multitask()
    files = []
    for i, size in enumerate(((64, 64), (80, 48))):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", size, (10 * i, 100, 200)).save(path)
        files.append(path)
    results = model.predict(files)
    assert len(results) == 2
    for result, size in zip(results, ((64, 64), (80, 48)), strict=True):
        assert {"coco", "ade20k", "token_fraction"} <= set(result)
        assert tuple(result["ade20k"]["mask"].shape) == (size[1], size[0])
        assert "boxes" in result["coco"] and "category_ids" in result["coco"]


def test_tasks_are_named_and_of_a_dense_kind() -> None:
    with pytest.raises(ValueError, match="tasks: name each task"):
        multitask(head={"tasks": {}})
    with pytest.raises(ValueError, match=r"tasks\.cls\.task='classification': expected one of"):
        multitask(head={"tasks": {"cls": {"task": "classification"}}})
