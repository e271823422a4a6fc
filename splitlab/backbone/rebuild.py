"""The ``timm.create_model`` calls: the one every backbone is built by (`create_vit`, errors that name
the setting), and the one that rebuilds a timm ViT a user already has.

A saved SPLIT model names its timm architecture and the arguments that differ from it, and
`splitlab.load` rebuilds the backbone from them before loading the weights. The arguments are read
from the module (grid, widths, depth, heads, MLP hidden size) and checked against the architecture
built on the meta device (no memory, no weights), so a model built with arguments splitlab does not
read is refused naming the first weight that would not fit, not rebuilt wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from timm.layers import GluMlp
from torch import nn


def mlp_hidden(block: nn.Module) -> int | None:
    """The hidden width of a timm block's MLP, as ``mlp_ratio`` sets it: ``fc1``'s width, half of it
    for a fused GLU (EVA-02's SwiGLU), ``fc1_g``'s for an unfused one; None without an MLP."""
    mlp = getattr(block, "mlp", None)
    if mlp is None:
        return None
    if getattr(mlp, "fc1_g", None) is not None:
        return int(mlp.fc1_g.out_features)
    fc1 = getattr(mlp, "fc1", None)
    if fc1 is None:
        return None
    return int(fc1.out_features) // 2 if isinstance(mlp, GluMlp) else int(fc1.out_features)


# ``timm.create_model`` arguments read off a built ViT (None: the module does not say)
STRUCTURE: dict[str, Callable[[nn.Module], Any]] = {
    "class_token": lambda m: getattr(m, "cls_token", None) is not None if hasattr(m, "cls_token") else None,
    "no_embed_class": lambda m: bool(m.no_embed_class) if hasattr(m, "no_embed_class") else None,
    "reg_tokens": lambda m: int(m.num_reg_tokens) if hasattr(m, "num_reg_tokens") else None,
    "global_pool": lambda m: getattr(m, "global_pool", None),
}


def architecture(vit: nn.Module) -> str:
    """The timm architecture name ``vit`` was built from (its ``pretrained_cfg``), or a one-line error."""
    name = (getattr(vit, "pretrained_cfg", None) or {}).get("architecture")
    if not name:
        raise ValueError(f"from_timm needs a model built by timm.create_model, got a {type(vit).__name__}")
    return str(name)


def rebuild_kwargs(vit: nn.Module, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``timm.create_model`` arguments that rebuild ``vit``'s architecture with its sizes: image and
    patch size, width, depth and heads always, the MLP ratio and the pooling where they are not the
    architecture's, then ``given`` (what the user says it was built with) over them all.

    Raises:
        ValueError: the rebuilt model's weights would not have ``vit``'s shapes (naming the first).
    """
    name = architecture(vit)
    block = vit.blocks[0]
    size = tuple(int(s) for s in vit.patch_embed.img_size)
    kwargs: dict[str, Any] = {
        "img_size": list(size) if size[0] != size[1] else size[0],
        "patch_size": int(vit.patch_embed.patch_size[0]),
        "embed_dim": int(vit.embed_dim),
        "depth": len(vit.blocks),
        "num_heads": int(block.attn.num_heads),
    }
    kwargs.update(given or {})
    built = _on_meta(name, kwargs)
    # the token layout and pooling it was built with (the pool decides the head's modules too: fc_norm,
    # an attention pool), where they are not the architecture's
    differ = {
        key: read(vit)
        for key, read in STRUCTURE.items()
        if key not in (given or {}) and read(vit) is not None and read(vit) != read(built)
    }
    if differ:
        kwargs.update(differ)
        built = _on_meta(name, kwargs)
    hidden = mlp_hidden(block)
    if hidden is not None and "mlp_ratio" not in (given or {}) and mlp_hidden(built.blocks[0]) != hidden:
        kwargs["mlp_ratio"] = hidden / int(vit.embed_dim)
        built = _on_meta(name, kwargs)
    mine = {k: tuple(v.shape) for k, v in built.state_dict().items() if not _head(k)}
    theirs = {k: tuple(v.shape) for k, v in vit.state_dict().items() if not _head(k)}
    if mine != theirs:
        key = next(k for k in sorted(mine.keys() | theirs.keys()) if mine.get(k) != theirs.get(k))
        raise ValueError(
            f"from_timm: {name} rebuilt with {kwargs} does not take the given model's weights ({key}: "
            f"{theirs.get(key, 'absent')} given, {mine.get(key, 'absent')} rebuilt): pass backbone_kwargs= "
            "the timm.create_model arguments it was built with"
        )
    return kwargs


def _head(key: str) -> bool:
    """A classifier weight (rebuilt by the task's head settings, not by the architecture)."""
    return key.startswith(("head.", "head_dist."))


def _on_meta(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``timm.create_model(name, **kwargs)`` with no memory behind its weights (shapes only; built on the
    CPU where an initialiser cannot run on the meta device)."""
    try:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False, **kwargs)
    except (NotImplementedError, RuntimeError):
        with torch.inference_mode(False):
            return timm.create_model(name, pretrained=False, **kwargs)


def create_vit(model_name: str, pretrained: bool = False, checkpoint_path: str = "", **kwargs) -> nn.Module:
    """``timm.create_model`` with errors that name the setting.

    With ``pretrained`` and local weights (``checkpoint_path``), the file takes the download's
    place and goes through timm's pretrained loader, which adapts position and patch embeddings to
    the model's size (the dense recipes run EVA-02 at /16 and 1024 px). timm's own
    ``checkpoint_path`` would fetch the pretrained weights first (fails offline) and then load the
    file strictly (fails at another size).
    """
    if not timm.is_model(model_name):
        close = timm.list_models(f"*{model_name.split('.')[0][:12]}*")[:5]
        hint = f" (close: {', '.join(close)})" if close else ""
        raise ValueError(f"model_name={model_name!r} is not a timm model{hint}")
    if checkpoint_path and not Path(checkpoint_path).is_file():
        raise FileNotFoundError(
            f"checkpoint_path={checkpoint_path}: no such file (the backbone's local weights)"
        )
    if pretrained and checkpoint_path:
        overlay = {**kwargs.pop("pretrained_cfg_overlay", {}), "file": checkpoint_path, "source": ""}
        if not checkpoint_path.endswith(".npz"):  # a torch / safetensors file, not the JAX weights' loader
            overlay["custom_load"] = False
        return timm.create_model(model_name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    try:
        return timm.create_model(model_name, pretrained=pretrained, checkpoint_path=checkpoint_path, **kwargs)
    except OSError as err:  # the hub unreachable (or offline) and no cached copy: name the ways out
        if not pretrained:
            raise
        raise OSError(
            f"model_name={model_name!r}: its pretrained weights could not be loaded ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:160]}); on a machine without the hub set model.init_args.backbone_kwargs.checkpoint_path "
            "to a local weights file, or fill the Hugging Face cache elsewhere and set HF_HUB_OFFLINE=1"
        ) from err
