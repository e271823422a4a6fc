"""What `SplitModel.from_timm` reads of a timm ViT a user already has: the config that rebuilds it
and the weights to copy, apart from the model class so that the class stays one file's read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from splitlab.backbone.families import check_family
from splitlab.backbone.rebuild import architecture, rebuild_kwargs
from splitlab.tokenizer import budget_points


def timm_config(
    vit: nn.Module,
    levels: Sequence[int] | None,
    task: str,
    budget: float,
    budget_range: Sequence[float] | None,
    **settings: Any,
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config, weights)``: the `SplitModel` config naming ``vit``'s architecture and sizes, and the
    backbone weights to load into it (a classifier keeps timm's head; another task's head is new)."""
    name = architecture(vit)
    check_family(vit, name)  # before reading its sizes: a refused family in one line
    kwargs = rebuild_kwargs(vit, dict(settings.pop("backbone_kwargs", None) or {}))
    head = dict(settings.pop("head", None) or {})
    if task == "classification":
        head = {"num_classes": int(vit.num_classes), "global_pool": vit.global_pool, **head}
    points = budget_points(budget_range) if budget_range else [budget]
    config = {
        **settings,
        "task": task,
        "backbone": name,
        "backbone_kwargs": kwargs,
        "levels": list(levels) if levels is not None else None,
        "budget": float(budget),
        "budget_points": points,
        "head": head,
    }
    weights = vit.state_dict()
    if task != "classification":  # the timm classifier is no part of another task's model
        weights = {k: v for k, v in weights.items() if not k.startswith(("head.", "head_dist."))}
    return config, weights
