"""The CUDA path (`make gpu-check` runs these; on a machine without a GPU they are collected and skipped).

Tolerances: float32 on GPU within 2e-4 of the reference (TF32 is switched off for the comparison);
bf16 within 5e-2 absolute on unit-scale activations (8 mantissa bits; flash / memory-efficient kernels
accumulate in float32 but round inputs and outputs to bf16).
"""

from __future__ import annotations

import pytest
import torch

from splitlab.backbone import BACKENDS, PackedSequence, PackedViT, resolve_backend
from splitlab.rl import FractionController, advantages, ppo_policy_loss
from splitlab.tokenizer import SplitTokenizer, calibrate_threshold, policy
from tests.helpers import layout_of

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]
CUDA = torch.device("cuda")
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 5e-2}


@pytest.fixture(autouse=True)
def _exact_float32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_matches_the_block_diagonal_reference(name, dtype) -> None:
    if not BACKENDS[name].available(CUDA, dtype):
        pytest.skip(f"{name} is not available for {dtype} here")
    lengths = [197, 64, 131, 9]
    gen = torch.Generator(CUDA).manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), 12, 64, device=CUDA, dtype=dtype, generator=gen) for _ in range(3))
    reference = PackedSequence.build(lengths, CUDA, BACKENDS["dense"]).attend(q.float(), k.float(), v.float())
    out = PackedSequence.build(lengths, CUDA, resolve_backend(name, CUDA, dtype)).attend(q, k, v)
    assert (out.float() - reference).abs().max().item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("name", ["vit_base_patch16_224", "eva02_base_patch16_clip_224"])
def test_uniform_layout_equals_timm_on_gpu(name) -> None:
    backbone = PackedViT(name, depth=4).to(CUDA).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (32, 16)).to(CUDA).eval()
    x = torch.randn(4, 3, 224, 224, device=CUDA)
    with torch.no_grad():
        packed = backbone(layout_of("uniform", tokenizer, backbone, x)).per_image()
        dense = backbone.model.forward_features(x)
    for i in range(4):
        assert (packed[i] - dense[i]).abs().max().item() <= 1e-3
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # the recipes' bf16-mixed
        packed = backbone(layout_of("uniform", tokenizer, backbone, x)).per_image()
        dense = backbone.model.forward_features(x)
    for i in range(4):  # the residual stream stays float32, as timm's; attention kernels differ in bf16
        assert packed[i].dtype == dense.dtype == torch.float32
        assert (packed[i] - dense[i]).abs().max().item() <= TOLERANCE[torch.bfloat16]


def test_a_packed_batch_equals_each_image_alone_on_gpu() -> None:
    backbone = PackedViT("vit_base_patch16_224", depth=4).to(CUDA).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (32, 16)).to(CUDA).eval()
    x = torch.randn(4, 3, 224, 224, device=CUDA)
    with torch.no_grad():
        mixed = layout_of(
            "random", tokenizer, backbone, x, fraction=0.6, generator=torch.Generator(CUDA).manual_seed(0)
        )
        batch = backbone(mixed).per_image()
        for i in range(4):
            labels = [d[i : i + 1] for d in mixed.decisions]
            alone = backbone(tokenizer(x[i : i + 1], backbone, mode="labels", labels=labels)).per_image()[0]
            assert (alone - batch[i]).abs().max().item() <= 1e-3


def test_compiled_blocks_do_not_recompile_per_packed_length() -> None:
    import torch._dynamo

    backbone = PackedViT("vit_base_patch16_224", depth=2).to(CUDA).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (32, 16)).to(CUDA).eval()
    for block in backbone.model.blocks:
        block.compile(dynamic=True)
    torch._dynamo.reset()
    frames = []
    with torch.no_grad():
        for fraction in (0.4, 0.55, 0.7, 0.85, 0.5, 0.65):
            x = torch.randn(8, 3, 224, 224, device=CUDA)
            layout = layout_of(
                "random",
                tokenizer,
                backbone,
                x,
                fraction=fraction,
                generator=torch.Generator(CUDA).manual_seed(1),
            )
            backbone(layout)
            frames.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert frames[-1] == frames[1], f"recompiled as packed lengths changed: unique graphs per batch {frames}"


def test_split_needs_no_more_memory_than_the_uniform_grid() -> None:
    backbone = PackedViT("vit_base_patch16_224").to(CUDA).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (32, 16)).to(CUDA).eval()
    x = torch.randn(32, 3, 224, 224, device=CUDA)

    def peak(fn) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    uniform = peak(lambda: backbone.model(x))
    for fraction in (0.5, 0.7, 1.0):
        gen = torch.Generator(CUDA).manual_seed(0)
        split = peak(
            lambda f=fraction, g=gen: backbone(
                layout_of("random", tokenizer, backbone, x, fraction=f, generator=g)
            )
        )
        assert split <= uniform * 1.05, (
            f"fraction {fraction}: {split / 2**20:.0f} MiB vs uniform {uniform / 2**20:.0f} MiB"
        )


def test_controller_and_ppo_step_agree_with_the_cpu() -> None:
    """λ exactly; the policy's logits after a PPO step within 1e-5 (same draws: they are made on the CPU)."""
    torch.manual_seed(0)
    logits = torch.randn(8, 4, 4)
    taken = policy.sample([logits], torch.Generator().manual_seed(0))[0]
    reward = torch.randn(2, 4)

    def step(device: torch.device) -> tuple[float, torch.Tensor]:
        controller = FractionController(0.5).to(device)
        for f in (0.8, 0.7, 0.6):
            lam = controller.update(torch.tensor(f, device=device))
        new = logits.clone().to(device).requires_grad_(True)
        adv = advantages(reward.to(device)).reshape(-1)
        loss, _ = ppo_policy_loss(
            [policy.log_prob(new, taken.to(device))],
            [policy.log_prob(logits.to(device), taken.to(device))],
            [policy.entropy(new)],
            [torch.ones_like(taken, device=device)],
            adv,
        )
        loss.backward()
        return lam, (new - 0.1 * new.grad).detach().cpu()

    lam_cpu, after_cpu = step(torch.device("cpu"))
    lam_gpu, after_gpu = step(CUDA)
    assert lam_gpu == pytest.approx(lam_cpu, abs=1e-6)
    assert torch.allclose(after_cpu, after_gpu, atol=1e-5)


def test_the_hard_cap_gives_a_static_bound_on_every_image() -> None:
    backbone = PackedViT("vit_base_patch16_224", depth=2).to(CUDA).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (64, 32, 16)).to(CUDA).eval()
    torch.nn.init.normal_(tokenizer.decision.mlp.fc2.weight, std=2.0)
    x = torch.randn(16, 3, 256, 256, device=CUDA)
    with torch.no_grad():
        tokens, _ = tokenizer.embed(x, backbone)
        tokenizer.operating_points.update(0, calibrate_threshold(tokenizer.decision_logits(tokens), 0.9))
        layout = tokenizer(x, backbone, max_tokens=128)
    assert max(layout.seqlens) <= 128 < max(tokenizer(x, backbone).seqlens)


@pytest.mark.parametrize("backend", ["auto", "flash"])
def test_bench_records_the_backend_it_timed(backend) -> None:
    """Under bf16 autocast the layout tokens stay float32, but attention runs in bf16: the backend
    is chosen (and reported) for bf16, so flash runs where it is installed."""
    from splitlab.backbone import flash_attn_importable
    from splitlab.commands.bench import BenchConfig, run_bench

    has_flash = flash_attn_importable()
    if backend == "flash" and not has_flash:
        pytest.skip("flash-attn is not installed")
    cfg = BenchConfig(
        model="vit_base_patch16_224",
        device="cuda",
        dtype="bfloat16",
        attn_backend=backend,
        fraction=0.7,
        batch_size=8,
        warmup=1,
        iters=1,
    )
    expected = "flash" if has_flash else "nested"
    assert run_bench(cfg)["attn_backend"] == expected
