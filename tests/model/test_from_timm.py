"""`SplitModel.from_timm`: a SPLIT model around a timm ViT the user built, its weights copied."""

from __future__ import annotations

import pytest
import timm
import torch

import splitlab
from splitlab import SplitModel


def vit(**kwargs):
    torch.manual_seed(0)
    sizes = {"img_size": 64, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2, "num_classes": 3}
    return timm.create_model("vit_tiny_patch16_224", **{**sizes, **kwargs}).eval()


@pytest.mark.parametrize("kwargs", [{}, {"mlp_ratio": 2.0}], ids=["plain", "narrow-mlp"])
def test_the_uniform_layout_is_the_timm_model_and_the_saved_model_rebuilds_it(kwargs, tmp_path) -> None:
    source = vit(**kwargs)
    model = SplitModel.from_timm(
        source, levels=[32, 16, 8], budget=0.5, decision_dim=16, decision_heads=2
    ).eval()
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model(images, policy="uniform")[0], source(images), atol=1e-5)
        outputs, layout = model(images)
    assert outputs.shape == (2, 3) and (layout.fraction < 1).any()  # a mixed layout, untrained policy
    model.save_pretrained(tmp_path / "saved")
    loaded = splitlab.load(tmp_path / "saved")
    with torch.no_grad():
        assert torch.equal(loaded(images)[0], outputs)
    assert loaded.config["backbone"] == "vit_tiny_patch16_224" and loaded.budget == 0.5


def test_the_token_mlp_is_kept_by_config_json(tmp_path) -> None:
    """``decision_features: mlp`` builds the decision module's token MLP, and a saved model rebuilds it
    with its weights; another value is refused naming the setting."""
    model = SplitModel.from_timm(
        vit(), levels=[32, 16, 8], budget=0.5, decision_dim=16, decision_heads=2, decision_features="mlp"
    ).eval()
    torch.nn.init.normal_(model.tokenizer.decision.token_mlp.fc2.weight)  # zero-initialised: made to matter
    images = torch.randn(2, 3, 64, 64)
    model.save_pretrained(tmp_path / "saved")
    loaded = splitlab.load(tmp_path / "saved")
    assert loaded.config["decision_features"] == "mlp" and loaded.tokenizer.decision.features == "mlp"
    with torch.no_grad():
        expected = model.tokenizer.decision_logits(model.tokenizer.embed(images, model.backbone)[0])
        got = loaded.tokenizer.decision_logits(loaded.tokenizer.embed(images, loaded.backbone)[0])
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    with pytest.raises(ValueError, match=r"decision_features='deep': expected one of \('linear', 'mlp'\)"):
        SplitModel.from_timm(vit(), levels=[32, 16, 8], decision_features="deep")


def test_a_conditioned_policy_and_another_task(tmp_path) -> None:
    model = SplitModel.from_timm(vit(depth=4), levels=[32, 16, 8], budget_range=[0.3, 0.7], task="segmentation",
                                 head={"num_classes": 5})  # fmt: skip
    assert model.task == "segmentation" and model.tokenizer.budget_conditioned
    assert model.tokenizer.operating_points.budgets.tolist() == pytest.approx([0.3, 0.4, 0.5, 0.6, 0.7])


def test_a_model_built_with_other_arguments_is_refused_naming_backbone_kwargs() -> None:
    with pytest.raises(ValueError, match=r"does not take the given model's weights .* pass backbone_kwargs="):
        SplitModel.from_timm(vit(qkv_bias=False), levels=[32, 16, 8])
    model = SplitModel.from_timm(vit(qkv_bias=False), levels=[32, 16, 8], backbone_kwargs={"qkv_bias": False})
    assert model.config["backbone_kwargs"]["qkv_bias"] is False
    with pytest.raises(ValueError, match="needs a model built by timm.create_model"):
        SplitModel.from_timm(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("context", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
def test_from_timm_anywhere(context, tmp_path) -> None:
    """Built inside inference mode (the ViT too) the model still trains: its parameters are ordinary
    tensors, and the resampled positions cache skips tensors without a version counter."""
    with context():
        source = vit()
        model = SplitModel.from_timm(
            source, levels=[32, 16, 8], budget=0.5, decision_dim=16, decision_heads=2
        )
        images = torch.randn(2, 3, 64, 64)
        outputs, _ = model(images, policy="uniform")
        assert torch.allclose(outputs, source(images), atol=1e-5)
    assert not any(t.is_inference() for t in [*model.parameters(), *model.buffers()])
    outputs, layout = model.train()(torch.randn(2, 3, 64, 64))
    outputs.sum().backward()  # trains outside the context
    assert model.backbone.model.blocks[0].attn.qkv.weight.grad is not None


def test_eva02_from_timm_reads_its_fused_swiglu_and_rebuilds_exactly(tmp_path) -> None:
    """EVA-02's fused SwiGLU doubles fc1 (mlp_ratio 5.33 read off its width did not fit its weights)."""
    source = timm.create_model("eva02_small_patch14_224", img_size=112, depth=2, num_classes=3).eval()
    model = SplitModel.from_timm(source, levels=[56, 28, 14]).eval()
    assert "mlp_ratio" not in model.config["backbone_kwargs"]  # the architecture's own
    images = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        assert torch.allclose(model(images, policy="uniform")[0], source(images), atol=1e-5)
    narrow = timm.create_model("eva02_small_patch14_224", img_size=112, depth=2, num_classes=3, mlp_ratio=2.0)
    assert SplitModel.from_timm(narrow, levels=[56, 28, 14]).config["backbone_kwargs"]["mlp_ratio"] == 2.0
