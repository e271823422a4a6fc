"""FSDP pieces that run without a GPU: what is sharded, clipping across shards, and sharded training
on two CPU ranks (FSDP runs on CPU with gloo when given the CPU as its device; Lightning does not)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from splitlab.distributed import block_parameter_ids, clip_grad_norm


def test_clipping_shards_matches_clipping_the_whole() -> None:
    """Two ranks each hold half of a block's gradient and the whole embedding gradient: the norm they
    agree on, and the clipped values, equal `clip_grad_norm_` on the unsharded gradients."""
    gen = torch.Generator().manual_seed(0)
    block, embed = torch.randn(10, generator=gen) * 3, torch.randn(4, generator=gen)
    whole = [nn.Parameter(torch.zeros(10)), nn.Parameter(torch.zeros(4))]
    whole[0].grad, whole[1].grad = block.clone(), embed.clone()
    expected = torch.nn.utils.clip_grad_norm_(whole, max_norm=2.0)

    ranks = []
    for r in range(2):
        shard, full = nn.Parameter(torch.zeros(5)), nn.Parameter(torch.zeros(4))
        shard.grad, full.grad = block[5 * r : 5 * r + 5].clone(), embed.clone()
        ranks.append((shard, full))
    shard_sq = [p.grad.pow(2).sum() for p, _ in ranks]  # what each rank contributes to the sum
    for r, (shard, full) in enumerate(ranks):
        total = clip_grad_norm(
            [shard, full], 2.0, {id(shard)}, lambda t, r=r: t + shard_sq[1 - r]
        )  # reduce_sum: this rank's square plus the other's
        assert total == pytest.approx(float(expected), rel=1e-6)
        assert torch.allclose(shard.grad, whole[0].grad[5 * r : 5 * r + 5], atol=1e-6)
        assert torch.allclose(full.grad, whole[1].grad, atol=1e-6)


def test_only_transformer_blocks_are_sharded() -> None:
    from splitlab.backbone import PackedViT
    from splitlab.tokenizer import SplitTokenizer

    backbone = PackedViT("test_vit", img_size=64)
    model = nn.ModuleDict(
        {"backbone": backbone, "tokenizer": SplitTokenizer(backbone.embed_dim, (32, 16, 8))}
    )
    sharded = block_parameter_ids(model)
    blocks = {id(p) for p in backbone.model.blocks.parameters()}
    assert sharded == blocks
    assert not sharded & {id(p) for p in model["tokenizer"].parameters()}
    assert id(backbone.model.patch_embed.proj.weight) not in sharded


def test_the_fsdp_internals_that_finish_a_backward_are_there() -> None:
    """`sharded_backward` calls two private FSDP functions (no public API finishes a backward run
    inside the root's forward): a torch that moves or reshapes them fails here, not on a cluster."""
    import inspect

    from torch.distributed.fsdp import _runtime_utils as fsdp

    assert list(inspect.signature(fsdp._post_backward_final_callback).parameters) == ["state", "module"]
    assert list(inspect.signature(fsdp._reset_flat_param_grad_info_if_needed).parameters) == ["handles"]


def _sharded_training(rank: int, world: int, store: str, case: str, results) -> None:
    """One rank: FSDP over timm blocks (the rest ignored, as `BlockFSDPStrategy` does), each step run
    inside the root's forward as Lightning runs ``training_step``; returns the parameters' largest
    gap to the same steps on one process without FSDP."""
    import copy
    import os

    import torch.distributed as dist
    from timm.models.vision_transformer import Block
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from splitlab.distributed import sharded_backward

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head, self.policy = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(8, 1)
            self.blocks = nn.Sequential(Block(8, 2), Block(8, 2))

        def losses(self, x: Tensor) -> tuple[Tensor, Tensor]:
            tokens = self.embed(x)
            return self.head(self.blocks(tokens)).pow(2).mean(), self.policy(tokens).pow(2).mean()

        def forward(self, step):  # FSDP's root forward runs the whole step, as under Lightning
            return step()

    model = Model()
    reference = copy.deepcopy(model)
    outside = [p for name, p in model.named_parameters() if not name.startswith("blocks.")]
    strategy, bf16 = case.removesuffix("-bf16"), case.endswith("-bf16")
    # Lightning's bf16-mixed as `BlockFSDPStrategy` adjusts it: bf16 block weights, autocast compute
    precision = (
        MixedPrecision(torch.bfloat16, torch.bfloat16, cast_root_forward_inputs=False) if bf16 else None
    )
    root = FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        ignored_states=outside,
        use_orig_params=True,
        sharding_strategy=ShardingStrategy[strategy],
        device_id=torch.device("cpu"),
        mixed_precision=precision,
    )
    sharded = block_parameter_ids(model)
    low = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    def train(net: nn.Module, batches: list[Tensor], on_root: bool) -> None:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
        for step, batch in enumerate(batches):
            if step == 3:  # PPO: the blocks frozen (between steps, as a stage starts), the policy twice
                net.blocks.requires_grad_(False)
            if on_root:  # each step inside the root's forward, as Lightning runs training_step
                root(lambda step=step, batch=batch: one_step(net, optimizer, step, batch, on_root))
            else:
                one_step(net, optimizer, step, batch, on_root)

    def one_step(net: nn.Module, optimizer, step: int, batch: Tensor, on_root: bool) -> None:
        with low:
            losses = [net.losses(batch) for _ in range(2 if step == 3 else 1)]
        optimizer.zero_grad()  # after the forward, as the task's step does
        for task, policy_loss in losses:
            loss = policy_loss if step == 3 else task + policy_loss
            if on_root:
                sharded_backward(root, loss.backward)
            else:
                loss.backward()
        if on_root:  # the task's average of what FSDP does not reduce
            for p in net.parameters():
                if id(p) not in sharded and p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
        clip_grad_norm(
            [p for p in net.parameters() if p.grad is not None],
            0.5,
            sharded if on_root else set(),
            (lambda t: dist.all_reduce(t, group=root.process_group) or t) if on_root else (lambda t: t),
        )
        optimizer.step()

    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(world, 3, 5, 4, generator=gen) for _ in range(4)]  # 3 images of 5 tokens a rank
    train(model, [b[rank] for b in batches], on_root=True)
    train(reference, [b.reshape(-1, 5, 4) for b in batches], on_root=False)  # the whole batch at once
    with FullyShardedDataParallel.summon_full_params(root):
        mine = {
            n.replace("_fsdp_wrapped_module.", ""): p.detach().clone() for n, p in model.named_parameters()
        }
    gap = max((mine[n] - p).abs().max().item() for n, p in reference.named_parameters())
    if rank == 0:
        results.put(gap)
    dist.barrier()
    # Leave without tearing gloo down: its threads now and then abort the process at exit
    # ("terminate called without an active exception"), after the result is already in.
    os._exit(0)


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("case", "tolerance"), [("FULL_SHARD", 1e-5), ("SHARD_GRAD_OP", 1e-5), ("FULL_SHARD-bf16", 0.05)]
)
def test_sharded_training_equals_training_on_one_process(tmp_path, case, tolerance) -> None:
    """Two CPU ranks (gloo): block shards reduce-scattered, the rest averaged by hand, clipping across
    shards, PPO's frozen blocks and two backward passes in one step: the weights equal one process's."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_sharded_training, args=(2, str(tmp_path / "store"), case, results), nprocs=2)
    assert results.get() < tolerance  # the blocks move by 0.67 over the 4 steps
