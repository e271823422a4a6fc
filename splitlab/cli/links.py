"""One setting per quantity: what the model states, the data follows (LightningCLI links).

The data's ``img_size`` is the model's input size and, where the data module has one (ADE20K), its
``num_classes`` is the model's. A link drops a value given for its target without a word, so a
data setting that differs from what the link sets is refused, naming the model's setting to change
instead (the same value passes: run folders saved before the links state both).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import timm
import yaml

from splitlab.model.preprocess import image_sides

# the data setting -> the model settings it follows
LINKED: dict[str, Any] = {
    "num_classes": "model.init_args.num_classes",
    "img_size": ("model.init_args.backbone", "model.init_args.backbone_kwargs"),
    "task_classes": "model.init_args.tasks",
}
INSTEAD = {
    "num_classes": "model.init_args.num_classes",
    "img_size": "model.init_args.backbone_kwargs.img_size",
    "task_classes": "model.init_args.tasks.<task>.num_classes",
}


def task_classes(tasks: dict[str, Any] | None) -> dict[str, int] | None:
    """A multi-task model's class count of each task (`splitlab.tasks.MultiTaskSplit`'s ``tasks``)."""
    if not tasks:
        return None
    return {
        name: int(t["num_classes"]) for name, t in tasks.items() if (t or {}).get("num_classes") is not None
    }


def model_input_size(backbone: str, backbone_kwargs: dict[str, Any] | None) -> int | list[int]:
    """The image size the model takes: ``backbone_kwargs.img_size``, else the timm model's own (its
    pretrained config); one side for a square input, ``[height, width]`` otherwise (classification
    reads any; the letterboxing readers refuse it, naming this setting)."""
    size = (backbone_kwargs or {}).get("img_size")
    if size is None:
        cfg = timm.get_pretrained_cfg(str(backbone)) or timm.get_pretrained_cfg(str(backbone).split(".")[0])
        if cfg is None:
            raise ValueError(
                f"model.init_args.backbone={backbone!r}: timm knows no input size of it; "
                "give model.init_args.backbone_kwargs.img_size"
            )
        size = cfg.input_size[-2:]
    sides = image_sides(size, "model.init_args.backbone_kwargs.img_size")
    return sides[0] if sides[0] == sides[1] else list(sides)


def _config_files(args: Sequence[str]) -> list[str]:
    files = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def given_data_settings(args: Sequence[str]) -> list[tuple[str, Any, str]]:
    """``(name, value, where)`` for each linked data setting the command line or a ``--config`` file
    states (the value as written)."""
    args = [str(a) for a in args]
    given: list[tuple[str, Any, str]] = []
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        for name in LINKED:
            if key in (f"--data.init_args.{name}", f"--data.{name}"):
                value = value if value or i + 1 >= len(args) else args[i + 1]
                given.append((name, yaml.safe_load(value) if value else None, "the command line"))
    for path in _config_files(args):
        try:
            config = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # the parser names an unreadable config itself
        data = config.get("data") if isinstance(config, dict) else None
        init = data.get("init_args", data) if isinstance(data, dict) else None
        for name in LINKED if isinstance(init, dict) else ():
            if name in init:
                given.append((name, init[name], path))
    return given


def data_settings(config: Any) -> dict[str, Any]:
    """The data module's settings in a parsed LightningCLI config (its subcommand's, when it has one),
    links applied."""
    config = config.get(config.get("subcommand") or "", config)
    data = config.get("data") if hasattr(config, "get") else None
    init = data.get("init_args") if hasattr(data, "get") else None
    return init.as_dict() if hasattr(init, "as_dict") else dict(init or {})


def refuse_linked_settings(args: Any, linked: dict[str, Any]) -> None:
    """Raise when the command line or a ``--config`` file gives a data setting another value than the
    model's (``linked``: what the links set). The same value passes: a run's saved ``config.yaml``
    from before the links states both, and agrees."""
    if not isinstance(args, list | tuple):
        return
    for name, value, where in given_data_settings(args):
        if name in linked and linked[name] is not None and value != linked[name]:
            raise ValueError(
                f"data.init_args.{name}={value} (in {where}) differs from the model's {linked[name]}: the data's "
                f"follows the model's, so set {INSTEAD[name]} instead (and state it once)"
            )
