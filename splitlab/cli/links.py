"""One setting per quantity: what the model states, the data follows (LightningCLI links).

The data's ``img_size`` is the model's input size and, where the data module has one (ADE20K), its
``num_classes`` is the model's. A link drops a value given for its target without a word, so a
data setting that a link sets is refused, naming the model's setting to change instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import timm
import yaml

# the data setting -> the model settings it follows
LINKED: dict[str, Any] = {
    "num_classes": "model.init_args.num_classes",
    "img_size": ("model.init_args.backbone", "model.init_args.backbone_kwargs"),
}
INSTEAD = {
    "num_classes": "model.init_args.num_classes",
    "img_size": "model.init_args.backbone_kwargs.img_size",
}


def model_input_size(backbone: str, backbone_kwargs: dict[str, Any] | None) -> int:
    """The square image side the model takes: ``backbone_kwargs.img_size``, else the timm model's
    own (its pretrained config)."""
    size = (backbone_kwargs or {}).get("img_size")
    if size is None:
        cfg = timm.get_pretrained_cfg(str(backbone)) or timm.get_pretrained_cfg(str(backbone).split(".")[0])
        if cfg is None:
            raise ValueError(
                f"model.init_args.backbone={backbone!r}: timm knows no input size of it; "
                "give model.init_args.backbone_kwargs.img_size"
            )
        size = cfg.input_size[-2:]
    sides = [int(size)] * 2 if isinstance(size, int | float) else [int(v) for v in size]
    if sides[0] != sides[1]:
        raise ValueError(
            f"model.init_args.backbone_kwargs.img_size={sides}: the data modules feed square images; "
            f"give one side, e.g. img_size: {sides[0]}"
        )
    return sides[0]


def _config_files(args: Sequence[str]) -> list[str]:
    files = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def refuse_linked_settings(args: Any) -> None:
    """Raise when the command line or a ``--config`` file sets a data setting the model's sets."""
    if not isinstance(args, list | tuple):
        return
    given = []
    for arg in args:
        for name in LINKED:
            if str(arg).split("=", 1)[0] in (f"--data.init_args.{name}", f"--data.{name}"):
                given.append((name, "the command line"))
    for path in _config_files([str(a) for a in args]):
        try:
            config = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # the parser names an unreadable config itself
        data = config.get("data") if isinstance(config, dict) else None
        init = data.get("init_args", data) if isinstance(data, dict) else None
        for name in LINKED if isinstance(init, dict) else ():
            if name in init:
                given.append((name, path))
    if given:
        name, where = given[0]
        raise ValueError(
            f"data.init_args.{name} (in {where}) follows the model's: set {INSTEAD[name]} instead, "
            "and state it once"
        )
