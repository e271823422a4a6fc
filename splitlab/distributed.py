"""Sharded training for the large backbones: Lightning's FSDP, wrapped per timm transformer block."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import FSDPStrategy
from timm.models.eva import EvaBlock, EvaBlockPostNorm
from timm.models.vision_transformer import Block, ResPostBlock

BLOCKS = {Block, ResPostBlock, EvaBlock, EvaBlockPostNorm}


class BlockFSDPStrategy(FSDPStrategy):
    """`FSDPStrategy` that shards each ViT / EVA block (and checkpoints its activations).

    A YAML config cannot spell FSDP's wrap policy (a set of module classes), hence this subclass.
    Gradients then reach every rank through FSDP's own reduce-scatter (splitlab's manual all-reduce
    is for DDP only). Lightning runs FSDP on GPUs only.

    Args:
        activation_checkpointing: recompute block activations in backward (saves memory on ViT-H / EVA-02-L).
        **kwargs: `FSDPStrategy` arguments (``sharding_strategy``, ``state_dict_type``, ``cpu_offload``, ...).
    """

    def __init__(self, activation_checkpointing: bool = True, **kwargs: Any) -> None:
        super().__init__(
            auto_wrap_policy=set(BLOCKS),
            activation_checkpointing_policy=set(BLOCKS) if activation_checkpointing else None,
            **kwargs,
        )
