"""Sharded training for the large backbones: Lightning's FSDP, sharding the transformer blocks only."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy
from timm.models.eva import EvaBlock, EvaBlockPostNorm
from timm.models.vision_transformer import Block, ResPostBlock
from torch import Tensor, nn

BLOCKS = (Block, ResPostBlock, EvaBlock, EvaBlockPostNorm)


def block_parameter_ids(model: nn.Module) -> set[int]:
    """``id`` of every parameter inside a transformer block: what `BlockFSDPStrategy` shards."""
    return {id(p) for m in model.modules() if isinstance(m, BLOCKS) for p in m.parameters()}


class BlockFSDPStrategy(FSDPStrategy):
    """`FSDPStrategy` that shards each ViT / EVA block (and checkpoints its activations) and nothing else.

    The blocks hold nearly all the weights (ViT-H: 99.6%). Everything outside them (the patch and
    position embeddings, the SPLIT tokenizer and decision module, the head) stays whole on every
    rank, as FSDP's ``ignored_states``, because SPLIT uses those modules outside the model's
    forward (calibrating operating points before validation, token-map pictures on rank 0) and
    backpropagates PPO's policy loss several times per batch, which FSDP's per-forward
    gather/reshard would not allow. Their gradients are averaged by the task
    (`splitlab.tasks.training`), the blocks' by FSDP's reduce-scatter; gradient clipping counts
    both (`clip_grad_norm`). A YAML config cannot spell FSDP's wrap policy (a set of module
    classes), hence this subclass. Lightning runs FSDP on GPUs only.

    Args:
        activation_checkpointing: recompute block activations in backward (saves memory on ViT-H / EVA-02-L).
        **kwargs: `FSDPStrategy` arguments (``sharding_strategy``, ``state_dict_type``, ``cpu_offload``, ...).
    """

    def __init__(self, activation_checkpointing: bool = True, **kwargs: Any) -> None:
        super().__init__(
            auto_wrap_policy=set(BLOCKS),
            activation_checkpointing_policy=set(BLOCKS) if activation_checkpointing else None,
            **{"use_orig_params": True, **kwargs},
        )

    def _setup_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            in_blocks = {id(m) for b in model.modules() if isinstance(b, BLOCKS) for m in b.modules()}
            outside = [m for m in model.modules() if id(m) not in in_blocks]
            for module in outside:  # FSDP moves only what it manages: the rest goes here
                for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                    tensor.data = tensor.data.to(self.root_device)
            owned = {id(p): p for m in outside for p in m.parameters(recurse=False)}  # tied ones once
            self.kwargs["ignored_states"] = list(owned.values())
        return super()._setup_model(model)


def clip_grad_norm(
    params: Iterable[nn.Parameter],
    max_norm: float,
    sharded: set[int],
    reduce_sum: Callable[[Tensor], Tensor],
) -> Tensor:
    """Clip ``params``' gradients to a total norm of ``max_norm`` when some are FSDP shards.

    A sharded gradient holds only this rank's part, so its squared norm is summed over ranks
    (``reduce_sum``); a whole one (the same on every rank) counts once. Every rank then scales by
    the same factor, as `torch.nn.utils.clip_grad_norm_` would on the unsharded gradients.

    Args:
        params: the optimizer's parameters.
        max_norm: the largest total norm kept.
        sharded: ``id`` of the parameters whose gradients are shards (`block_parameter_ids`).
        reduce_sum: sum over ranks (identity on one process).

    Returns:
        The total norm before clipping.
    """
    grads = [(id(p) in sharded, p.grad) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    device = grads[0][1].device
    zero = torch.zeros((), device=device)
    shard_sq = sum((g.float().pow(2).sum() for s, g in grads if s), zero)
    whole_sq = sum((g.float().pow(2).sum() for s, g in grads if not s), zero)
    total = (reduce_sum(shard_sq) + whole_sq).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for _, g in grads:
        g.mul_(scale.to(g.dtype))
    return total
