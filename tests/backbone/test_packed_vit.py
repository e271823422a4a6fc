"""`PackedViT`: uniform equivalence with timm, packed = per-image, clear refusals."""

from __future__ import annotations

import pytest
import timm
import torch

from splitlab.backbone import PackedViT
from splitlab.tokenizer import Levels, SplitTokenizer
from tests.helpers import layout_of


def uniform_layout(tokenizer, backbone, x):
    return layout_of("uniform", tokenizer, backbone, x)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("vit_tiny_patch16_224", {}),
        ("test_vit", {}),
        ("vit_tiny_patch16_224", {"depth": 2, "reg_tokens": 4, "no_embed_class": True}),
        ("vit_tiny_patch16_224", {"depth": 2, "class_token": False, "global_pool": "avg", "img_size": 128}),
        ("vit_small_patch14_dinov2", {"depth": 2, "img_size": 112}),
        ("vit_tiny_patch16_224", {"depth": 2, "block_fn": timm.models.vision_transformer.ResPostBlock}),
        ("eva02_tiny_patch14_224", {"img_size": 112, "depth": 2}),  # EVA-02: rotary embedding per token
        ("eva02_small_patch14_224", {"img_size": 112, "depth": 2, "num_classes": 10}),
        ("eva02_base_patch16_clip_224", {"img_size": 128, "depth": 2}),
    ],
)
def test_uniform_layout_equals_timm_forward_features(name, kwargs) -> None:
    backbone = PackedViT(name, **kwargs).eval()
    levels = Levels.default(backbone.patch_size, backbone.img_size)
    tokenizer = SplitTokenizer(backbone.embed_dim, levels).eval()
    x = torch.randn(3, 3, *backbone.img_size)
    with torch.no_grad():
        reference = backbone.model.forward_features(x)
        features = backbone(uniform_layout(tokenizer, backbone, x))
        packed = torch.stack(features.per_image())
        assert packed.shape == reference.shape
        assert (packed - reference).abs().max().item() <= 1e-4
        head = backbone.forward_head(features)
        assert (head - backbone.model.forward_head(reference)).abs().max().item() <= 1e-4


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("vit_tiny_patch16_224", {"depth": 4}),
        ("vit_tiny_patch16_224", {"depth": 2, "reg_tokens": 4, "no_embed_class": True}),
        ("eva02_tiny_patch14_224", {"img_size": 112, "depth": 2}),
    ],
)
def test_uniform_layout_equals_timm_under_bf16_autocast(name, kwargs) -> None:
    """The recipes train in ``bf16-mixed``: timm's float32 position embedding keeps its residual
    stream float32 under autocast, and so must the packed one (in bf16 throughout it drifted 3x
    further from the float32 model: 0.077 against timm's 0.024 on a 4-block ViT-Ti)."""
    backbone = PackedViT(name, **kwargs).eval()
    tokenizer = SplitTokenizer(
        backbone.embed_dim, Levels.default(backbone.patch_size, backbone.img_size)
    ).eval()
    x = torch.randn(2, 3, *backbone.img_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = backbone.model.forward_features(x)
        layout = uniform_layout(tokenizer, backbone, x)
        packed = torch.stack(backbone(layout).per_image())
    assert layout.tokens.dtype == reference.dtype == packed.dtype == torch.float32
    assert (packed - reference).abs().max().item() <= 1e-3


def test_intermediates_match_timm(tiny_vit, tiny_tokenizer) -> None:
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        features = tiny_vit(uniform_layout(tiny_tokenizer, tiny_vit, x), indices=[0, 1])
        _, reference = tiny_vit.model.forward_intermediates(x, indices=[0, 1], norm=False, output_fmt="NLC")
    for got, want in zip(features.intermediates, reference, strict=True):
        assert (got.view(3, 16, -1) - want).abs().max().item() <= 1e-5


def test_packed_batch_equals_each_image_alone(tiny_vit, tiny_tokenizer) -> None:
    x = torch.randn(5, 3, 64, 64)
    gen = torch.Generator().manual_seed(0)
    labels = [torch.rand(5, 1, 1, generator=gen) < 0.7, torch.rand(5, 2, 2, generator=gen) < 0.5]
    with torch.no_grad():
        batch = tiny_vit(tiny_tokenizer(x, tiny_vit, mode="labels", labels=labels), indices=1)
        assert len(set(batch.layout.seqlens)) > 1  # the images really have different lengths
        for i in range(5):
            single = tiny_vit(
                tiny_tokenizer(
                    x[i : i + 1], tiny_vit, mode="labels", labels=[lab[i : i + 1] for lab in labels]
                ),
                indices=1,
            )
            assert (single.per_image()[0] - batch.per_image()[i]).abs().max().item() <= 1e-5
            assert (
                single.intermediates[0] - batch.layout.split(batch.intermediates[0])[i]
            ).abs().max() <= 1e-5


def test_gradients_through_packing_equal_timms_on_a_uniform_layout(tiny_vit, tiny_tokenizer) -> None:
    """Backward through the packed path is the dense model's backward: on a uniform layout every
    weight's gradient equals the one timm's own ``forward_features`` gives (same loss, same images);
    on a mixed layout gradients still reach the embedding, the blocks and the class token."""
    tiny_vit.train()
    x = torch.randn(2, 3, 64, 64)
    weight = torch.randn(2, 17, tiny_vit.embed_dim)  # a loss that weighs every token differently
    (tiny_vit.model.forward_features(x) * weight).sum().backward()
    dense = {n: p.grad.clone() for n, p in tiny_vit.model.named_parameters() if p.grad is not None}
    tiny_vit.zero_grad()
    packed = torch.stack(tiny_vit(uniform_layout(tiny_tokenizer, tiny_vit, x)).per_image())
    (packed * weight).sum().backward()
    grads = {n: p.grad for n, p in tiny_vit.model.named_parameters() if p.grad is not None}
    assert set(grads) == set(dense) and len(dense) > 10
    for name, grad in grads.items():
        assert torch.allclose(grad, dense[name], atol=1e-5, rtol=1e-4), name
    tiny_vit.zero_grad()
    features = tiny_vit(tiny_tokenizer(x, tiny_vit, mode="sample"))
    assert features.layout.fraction.max() < 1  # some patches stayed coarse
    (features.tokens.sum() + features.prefix.sum()).backward()
    for param in (tiny_vit.model.patch_embed.proj.weight, tiny_vit.model.blocks[0].attn.qkv.weight):
        assert param.grad.abs().sum() > 0
    assert tiny_vit.model.cls_token.grad.abs().sum() > 0


def test_resampled_position_embedding_follows_the_weights_it_was_cached_from() -> None:
    """Under inference mode a coarse grid's resample is computed once; an update of the embedding
    (an optimizer step, a state-dict load) or a dtype move is seen at once, and autograd never
    reads the cache (the embedding trains through it)."""
    backbone = PackedViT("test_vit", img_size=64)
    pos = backbone.model.pos_embed
    with torch.inference_mode():
        first = backbone.pos_embed_level((4, 4), 2)
        assert backbone.pos_embed_level((4, 4), 2) is first  # cached
    with torch.no_grad():
        pos.add_(1.0)  # as an optimizer step does, in place
    with torch.inference_mode():
        updated = backbone.pos_embed_level((4, 4), 2)
    assert torch.allclose(updated, first + 1.0, atol=1e-5)  # bicubic weights sum to one
    backbone.load_state_dict({k: v.clone() * 0 for k, v in backbone.state_dict().items()})
    with torch.inference_mode():
        assert backbone.pos_embed_level((4, 4), 2).abs().max() == 0
    backbone.double()
    with torch.inference_mode():
        assert backbone.pos_embed_level((4, 4), 2).dtype == torch.float64
    grad_path = backbone.pos_embed_level((4, 4), 2)
    assert grad_path.requires_grad and grad_path.grad_fn is not None


def test_dense_model_still_works_after_patching(tiny_vit) -> None:
    x = torch.randn(2, 3, 64, 64)
    fresh = timm.create_model("test_vit", img_size=64, depth=2).eval()
    fresh.load_state_dict(tiny_vit.model.state_dict())
    with torch.no_grad():
        assert torch.allclose(tiny_vit.model(x), fresh(x), atol=1e-6)


def test_unknown_model_names_the_setting() -> None:
    with pytest.raises(ValueError, match="model_name='vit_nonexistent_patch16' is not a timm model"):
        PackedViT("vit_nonexistent_patch16")


def test_local_weights_replace_the_pretrained_download(tmp_path, monkeypatch) -> None:
    """Offline clusters: ``pretrained: true`` with ``checkpoint_path`` loads the file, adapted to the
    model's size as the download would be (position embeddings resampled), and fetches nothing."""
    import timm.models._builder as builder

    kwargs = {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}
    weights = timm.create_model("vit_tiny_patch16_224", img_size=32, **kwargs).state_dict()
    torch.save(weights, tmp_path / "vit.pth")

    def no_network(*args, **kwargs):
        raise AssertionError("tried to download pretrained weights")

    monkeypatch.setattr(builder, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(builder, "load_state_dict_from_hf", no_network)
    monkeypatch.setattr(builder, "download_cached_file", no_network)
    same = PackedViT(
        "vit_tiny_patch16_224",
        pretrained=True,
        checkpoint_path=str(tmp_path / "vit.pth"),
        img_size=32,
        **kwargs,
    )
    assert all(torch.equal(same.model.state_dict()[k], v) for k, v in weights.items())
    larger = PackedViT(
        "vit_tiny_patch16_224",
        pretrained=True,
        checkpoint_path=str(tmp_path / "vit.pth"),
        img_size=64,
        **kwargs,
    )
    assert larger.model.pos_embed.shape[1] == 1 + 8 * 8  # resampled from 4 x 4
    assert torch.equal(larger.model.blocks[0].attn.qkv.weight, weights["blocks.0.attn.qkv.weight"])
    with pytest.raises(FileNotFoundError, match="checkpoint_path=.*missing.pth: no such file"):
        PackedViT(
            "vit_tiny_patch16_224", pretrained=True, checkpoint_path=str(tmp_path / "missing.pth"), **kwargs
        )


def test_non_vit_model_is_refused() -> None:
    with pytest.raises(
        ValueError, match="model_name='resnet18' builds a timm ResNet, which is not supported"
    ):
        PackedViT("resnet18")


def test_unsupported_attention_is_refused() -> None:
    with pytest.raises(ValueError, match="block type ParallelScalingBlock fuses attention with the MLP"):
        PackedViT(
            "vit_tiny_patch16_224", depth=1, block_fn=timm.models.vision_transformer.ParallelScalingBlock
        )
