"""Sharded training for the large backbones: Lightning's FSDP, sharding the transformer blocks only."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy
from timm.models.eva import EvaBlock, EvaBlockPostNorm
from timm.models.vision_transformer import Block, ResPostBlock
from torch import Tensor, nn

from splitlab.checkpoint import read_checkpoint
from splitlab.lightning_private import ModelSetupHook, fsdp_state_dict_type

BLOCKS = (Block, ResPostBlock, EvaBlock, EvaBlockPostNorm)


def block_parameter_ids(model: nn.Module) -> set[int]:
    """``id`` of every parameter inside a transformer block: what `BlockFSDPStrategy` shards."""
    return {id(p) for m in model.modules() if isinstance(m, BLOCKS) for p in m.parameters()}


def average_gradients(params: Iterable[nn.Parameter]) -> None:
    """Average ``params``' gradients over the ranks in one coalesced all-reduce; a parameter without a
    gradient on a rank counts as zero there, so every rank ends with the same gradients."""
    params = list(params)
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch._utils._flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat)
    flat /= torch.distributed.get_world_size()
    for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        p.grad = g


class BlockFSDPStrategy(ModelSetupHook, FSDPStrategy):
    """`FSDPStrategy` that shards each ViT / EVA block (and checkpoints its activations) and nothing else.

    The blocks hold nearly all the weights (ViT-H: 99.6%). Everything outside them (the patch and
    position embeddings, the SPLIT tokenizer and decision module, the head) stays whole on every
    rank, as FSDP's ``ignored_states``, because SPLIT uses those modules outside the model's
    forward (calibrating operating points before validation, token-map pictures on rank 0) and
    backpropagates PPO's policy loss several times per batch, which FSDP's per-forward
    gather/reshard would not allow. Their gradients are averaged by `average_gradients` (from the
    task's `backward_synced`), the blocks' by FSDP's reduce-scatter; gradient clipping counts
    both (`clip_grad_norm`). A YAML config cannot spell FSDP's wrap policy (a set of module
    classes), hence this subclass. It also runs on CPU ranks (gloo; ``32-true`` precision), which
    Lightning's own FSDP refuses: that is how the tests fit it without a GPU. ``NO_SHARD`` is
    refused (that is DDP); the task finishes each backward itself (`sharded_backward`).

    Args:
        activation_checkpointing: recompute block activations in backward (saves memory on ViT-H / EVA-02-L).
        **kwargs: `FSDPStrategy` arguments (``sharding_strategy``, ``state_dict_type``, ``cpu_offload``, ...).
    """

    def __init__(self, activation_checkpointing: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("use_orig_params", True)
        super().__init__(
            auto_wrap_policy=set(BLOCKS),
            activation_checkpointing_policy=set(BLOCKS) if activation_checkpointing else None,
            **kwargs,
        )
        if self.sharding_strategy.name == "NO_SHARD":  # every rank would hold whole gradients
            raise ValueError(
                "trainer.strategy.init_args.sharding_strategy=NO_SHARD: BlockFSDPStrategy shards the blocks; "
                "for whole copies on every rank use trainer.strategy=ddp"
            )
        try:  # the private FSDP steps `sharded_backward` runs: fail here, not at the first backward
            from torch.distributed.fsdp._runtime_utils import (  # noqa: F401
                _post_backward_final_callback,
                _reset_flat_param_grad_info_if_needed,
            )
        except ImportError as err:
            raise RuntimeError(
                f"BlockFSDPStrategy needs FSDP internals this torch ({torch.__version__}) lacks ({err}); "
                "use torch 2.5-2.14 or trainer.strategy=ddp"
            ) from err
        if fsdp_state_dict_type(self) == "sharded":
            # a folder of shards: --ckpt_path, load_task, bench and the settings check read one file
            raise ValueError(
                "trainer.strategy.init_args.state_dict_type=sharded: splitlab resumes, evaluates and benchmarks "
                "from one checkpoint file; use state_dict_type=full (rank 0 gathers the blocks when saving)"
            )

    @property
    def mixed_precision_config(self) -> Any:
        """Lightning's mixed precision for the blocks' weights and gradients, but nothing else cast.

        Lightning asks FSDP to cast every buffer and the root's inputs to the low precision. The
        buffers are SPLIT's budgets, operating points and λ controller (0.7 becomes 0.69921875 in
        bf16, refused against the trained budgets on reload; a λ step below 0.004 is lost); the
        root's input is the whole batch, targets too (a COCO box edge at x = 1000 lands on a 4 px grid
        in bf16). Under the ``*-mixed`` precisions autocast already runs the compute in the low
        precision, and the blocks hold no buffers, so keeping both as they are costs nothing (an
        explicit ``mixed_precision=`` is adjusted the same way).
        """
        config = super().mixed_precision_config
        if config is None:
            return config
        return dataclasses.replace(config, buffer_dtype=None, cast_root_forward_inputs=False)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's FSDP reads a full checkpoint with an unpickler of its own, which runs whatever
        the file names: `read_checkpoint` reads it first (mapped, the weights not loaded) and refuses
        a file that holds more than weights and plain settings."""
        if Path(str(checkpoint_path)).is_file():
            read_checkpoint(checkpoint_path, "ckpt_path", mmap=True)
        return super().load_checkpoint(checkpoint_path, weights_only)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """FSDP over the blocks, everything else whole on every rank (``ignored_states``), moved to the
        device here since FSDP moves only what it manages; on CPU ranks FSDP is built here, with the
        CPU as its device, which Lightning does not give it."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            in_blocks = {id(m) for b in model.modules() if isinstance(b, BLOCKS) for m in b.modules()}
            outside = [m for m in model.modules() if id(m) not in in_blocks]
            for module in outside:  # FSDP moves only what it manages: the rest goes here
                for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                    tensor.data = tensor.data.to(self.root_device)
            owned = {id(p): p for m in outside for p in m.parameters(recurse=False)}  # tied ones once
            self.kwargs["ignored_states"] = list(owned.values())
            if self.root_device.type == "cpu":  # FSDP runs on CPU (gloo) when given the CPU as device;
                model = FullyShardedDataParallel(  # Lightning gives it none and FSDP refuses
                    module=model,
                    cpu_offload=self.cpu_offload,
                    mixed_precision=self.mixed_precision_config,
                    sharding_strategy=self.sharding_strategy,
                    device_id=torch.device("cpu"),
                    **self.kwargs,
                )
                wrap_policy = self.kwargs.pop("auto_wrap_policy")  # applied: Lightning would warn
                try:
                    return self.lightning_wrap_model(model)
                finally:
                    self.kwargs["auto_wrap_policy"] = wrap_policy
        return self.lightning_wrap_model(model)


def clip_grad_norm(
    params: Iterable[nn.Parameter],
    max_norm: float,
    sharded: set[int],
    reduce_sum: Callable[[Tensor], Tensor],
) -> Tensor:
    """Clip ``params``' gradients to a total norm of ``max_norm`` when some are FSDP shards.

    A sharded gradient holds only this rank's part, so its squared norm is summed over the ranks
    that split one copy (``reduce_sum``: FSDP's shard group, all ranks under FULL_SHARD, one node's
    under HYBRID_SHARD); a whole one (the same on every rank) counts once. Every rank then scales by
    the same factor, as `torch.nn.utils.clip_grad_norm_` would on the unsharded gradients.

    Args:
        params: the optimizer's parameters.
        max_norm: the largest total norm kept.
        sharded: ``id`` of the parameters whose gradients are shards (`block_parameter_ids`).
        reduce_sum: sum over the shard group (identity on one process).

    Returns:
        The total norm before clipping.
    """
    grads = [(id(p) in sharded, p.grad) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    # where the sums meet: a whole gradient's device (the GPU, also when FSDP offloads the shards)
    device = next((g.device for s, g in grads if not s), grads[0][1].device)
    zero = torch.zeros((), device=device)
    shard_sq = sum((g.float().pow(2).sum().to(device) for s, g in grads if s), zero)
    whole_sq = sum((g.float().pow(2).sum().to(device) for s, g in grads if not s), zero)
    total = (reduce_sum(shard_sq) + whole_sq).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for _, g in grads:
        g.mul_(scale.to(g.device, g.dtype))
    return total


def sharded_backward(root: nn.Module, backward: Callable[[], None]) -> None:
    """``backward()`` under FSDP, finished as FSDP finishes a backward of its own.

    FSDP queues its end-of-backward step (wait for the reduce-scatters, hand each block its gradient
    shard, reset for the next pass) from a hook on the root module's forward outputs. With manual
    optimization Lightning runs ``training_step``, and so the backward, *inside* the root's forward,
    where that hook never fires (Lightning-AI/pytorch-lightning#19685): the shards would never
    reach the optimizer and the next backward would add onto them. So this does, around
    ``backward``, what the root's pre-backward hook and its queued callback would do. They are
    torch's private FSDP functions (present from torch 2.1 through 2.14; the import fails loudly
    if they move).
    """
    from torch.distributed.fsdp._runtime_utils import (
        _post_backward_final_callback,
        _reset_flat_param_grad_info_if_needed,
    )

    _reset_flat_param_grad_info_if_needed(root._all_handles)  # after zero_grad(set_to_none)
    backward()
    _post_backward_final_callback(root, root)
