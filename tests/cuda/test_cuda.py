"""The CUDA path (`make gpu-check` runs these; on a machine without a GPU they are collected and skipped).

Tolerances: float32 on GPU within 2e-4 of the reference (TF32 is switched off for matmuls and cuDNN
convolutions during these tests); bf16 within 5e-2 absolute on unit-scale activations (8 mantissa
bits; flash / memory-efficient kernels accumulate in float32 but round inputs and outputs to bf16).

Only torch, timm and splitlab's plain-PyTorch rooms are imported here (no Lightning, no CLI), so a
missing CLI dependency fails the two tests that run ``splitlab bench`` code, not all of them. Tests
whose name holds ``compiled`` or ``flex`` compile (Inductor): `scripts/gpu-check.sh` runs them as a
step of their own (``-k "compiled or flex"``), so name a new compiling test accordingly.
"""

from __future__ import annotations

import copy

import pytest
import torch

from splitlab.backbone import BACKENDS, PackedSequence, PackedViT, resolve_backend
from splitlab.rl import FractionController, advantages, ppo_policy_loss
from splitlab.tokenizer import SplitTokenizer, baseline_scores, calibrate_threshold, policy

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]
CUDA = torch.device("cuda")
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 5e-2}


@pytest.fixture(autouse=True)
def _exact_float32():
    """TF32 off: matmuls (off by default) and cuDNN convolutions (on by default: the patch embedding
    would round to 10 mantissa bits, 1e-3 apart between a batch and one image, and from the CPU)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def layout_of(name: str, tokenizer, backbone, images, **kwargs):
    """A baseline layout through the tokenizer (`tests.helpers.layout_of`, here so that this module
    needs no Lightning or CLI import)."""
    scores, threshold = baseline_scores(name, images, tokenizer.levels, **kwargs)
    return tokenizer(images, backbone, mode="scores", scores=scores, threshold=threshold)


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
            "random", tokenizer, backbone, x, budget=0.6, generator=torch.Generator(CUDA).manual_seed(0)
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
                budget=fraction,
                generator=torch.Generator(CUDA).manual_seed(1),
            )
            backbone(layout)
            frames.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert frames[-1] == frames[1], f"recompiled as packed lengths changed: unique graphs per batch {frames}"


MEMORY_SLACK_MIB = 2.0


@pytest.mark.parametrize("fraction", [0.5, 0.7, 1.0])
def test_split_needs_no_more_memory_than_the_uniform_grid(fraction) -> None:
    """What one bf16 batch of 32 ViT-B/16 images adds at its peak over what was allocated before it,
    as `splitlab bench` measures it (`peak_memory`: weights and input excluded; under inference
    mode autocast caches no bf16 copies of the weights, it casts each as it is used): timm's
    ``forward_features`` against SPLIT's tokenizer and packed blocks, both ending at the final norm
    (no head on either side). Each path runs once first, so one-time allocations (cuBLAS
    workspaces, the walk's cached tables) count against neither, and the allocator's cache is
    emptied before each measurement, so both start alike. Slack 2 MiB: the caching allocator rounds
    blocks up (512 B; a large block it does not split keeps up to 1 MiB more), and the layout keeps
    its small index tensors (levels, boxes, cover: ~0.5 MiB here). At f = 1 the layout also still
    holds its tokens, (B·N, D) float32, while the blocks run on the packed copy: that copy is
    allowed there only."""
    from splitlab.commands.bench_measures import peak_memory

    backbone = PackedViT("vit_base_patch16_224").to(CUDA).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (32, 16)).to(CUDA).eval()
    x = torch.randn(32, 3, 224, 224, device=CUDA)

    def uniform():
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            return backbone.model.forward_features(x)

    def split():
        gen = torch.Generator(CUDA).manual_seed(0)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            return backbone(layout_of("random", tokenizer, backbone, x, budget=fraction, generator=gen))

    uniform()  # one-time allocations
    tokens = split().layout.tokens
    copy_mib = tokens.numel() * tokens.element_size() / 2**20 if fraction == 1.0 else 0.0
    del tokens
    torch.cuda.empty_cache()
    peak_uniform = peak_memory(uniform, CUDA)
    torch.cuda.empty_cache()
    peak_split = peak_memory(split, CUDA)
    assert peak_split <= peak_uniform + copy_mib + MEMORY_SLACK_MIB, (
        f"fraction {fraction}: SPLIT adds {peak_split:.1f} MiB at its peak, timm's forward_features "
        f"{peak_uniform:.1f} MiB (allowed: + {copy_mib:.1f} MiB layout copy + {MEMORY_SLACK_MIB:g} MiB slack)"
    )


def test_controller_and_ppo_step_agree_with_the_cpu() -> None:
    """λ within 1e-6 (the same float32 steps on both devices); the policy's logits after a PPO step
    within 1e-5 (reductions sum in another order on the GPU).

    The sampled decisions are drawn once, on the CPU, and handed to both devices. That is the limit
    of this comparison: the pipeline samples from a generator on the images' device, and CUDA's
    Philox stream gives other draws than the CPU's Mersenne Twister for the same seed, so sampled
    layouts are not comparable across devices. Deployment's deterministic decisions are:
    `test_threshold_decisions_on_gpu_equal_the_cpus`."""
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


DECISION_TOLERANCE = 1e-3


def test_threshold_decisions_on_gpu_equal_the_cpus() -> None:
    """Deployment decides in ``threshold`` mode, deterministically: from the same weights and images
    the GPU gives the CPU's split logits within 1e-3 (float32, TF32 off; the devices sum in other
    orders) and so the same decisions, except where a logit lies within 1e-3 of the calibrated cut
    (it may land on either side there; fewer than 1% of the decisions lie that close)."""
    backbone = PackedViT("vit_base_patch16_224", depth=1).eval()  # the decisions read its embeddings only
    tokenizer = SplitTokenizer(backbone.embed_dim, (64, 32, 16)).eval()
    torch.nn.init.normal_(tokenizer.decision.mlp.fc2.weight, std=2.0)  # spread logits, as a trained policy
    x = torch.randn(8, 3, 256, 256)
    with torch.no_grad():
        tokens, _ = tokenizer.embed(x, backbone)
        tokenizer.operating_points.set(0, calibrate_threshold(tokenizer.decision_logits(tokens), 0.6))
        on_cpu, logits_cpu = tokenizer.decide(tokens, "threshold")
        gpu_backbone, gpu_tokenizer = copy.deepcopy(backbone).to(CUDA), copy.deepcopy(tokenizer).to(CUDA)
        gpu_tokens, _ = gpu_tokenizer.embed(x.to(CUDA), gpu_backbone)
        on_gpu, logits_gpu = gpu_tokenizer.decide(gpu_tokens, "threshold")
    cut = float(tokenizer.operating_points.cuts[0])
    near = decided = 0
    for level, (d_cpu, d_gpu, l_cpu, l_gpu) in enumerate(
        zip(on_cpu, on_gpu, logits_cpu, logits_gpu, strict=True)
    ):
        l_gpu, d_gpu = l_gpu.cpu(), d_gpu.cpu()
        gap = (l_gpu - l_cpu).abs().max().item()
        assert gap <= DECISION_TOLERANCE, f"level {level}: GPU logits {gap:.2e} from the CPU's"
        close = (l_cpu - cut).abs() < DECISION_TOLERANCE
        assert not ((d_cpu != d_gpu) & ~close).any(), f"level {level}: decisions differ away from the cut"
        near, decided = near + int(close.sum()), decided + close.numel()
    assert sum(int(d.sum()) for d in on_cpu) > 0, "nothing split: the comparison would say nothing"
    assert near < 0.01 * decided, f"{near} of {decided} logits lie within {DECISION_TOLERANCE} of the cut"


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
        budget=0.7,
        batch_size=8,
        warmup=1,
        iters=1,
    )
    expected = "flash" if has_flash else "nested"
    assert run_bench(cfg)["attn_backend"] == expected
