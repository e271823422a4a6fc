"""`splitlab.load`: a `SplitModel` from whatever a user has: a run folder, a training checkpoint, a
folder written by ``save_pretrained``, or a Hugging Face Hub id."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch

from splitlab.checkpoint import read_checkpoint
from splitlab.model.base import SplitModel
from splitlab.version import __version__

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def from_checkpoint(path: str | Path, setting: str = "checkpoint") -> SplitModel:
    """The `SplitModel` inside a splitlab training checkpoint (a ``.ckpt`` of any task)."""
    checkpoint = read_checkpoint(path, setting, mmap=True)
    meta = checkpoint.get("splitlab") if isinstance(checkpoint, dict) else None
    if meta is None or "state_dict" not in checkpoint:
        raise ValueError(f"{setting}={str(path)!r} was not written by a splitlab task")
    config = meta.get("model")
    if not config:
        raise ValueError(
            f"{setting}={str(path)!r} records no model config (splitlab.model): it was not written by this "
            f"splitlab version ({__version__})"
        )
    if "stage" in meta and not config.get("trained"):  # written before the model kept its record
        stage = meta["stage"]
        config = {
            **config,
            "trained": {"stage": stage, "ppo_steps": meta.get("ppo_steps", int(stage == "ppo"))},
        }
    state = checkpoint["state_dict"]
    weights = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
    model = SplitModel.from_config(config)
    model.load_weights(weights, f"{setting}={str(path)!r}")
    return model


def _by_age(paths: Any) -> list[Path]:
    return sorted(paths, key=lambda p: p.stat().st_mtime)


def run_checkpoint(folder: Path, setting: str = "model") -> Path:
    """The checkpoint a run folder deploys: its newest ``checkpoints/last*.ckpt`` (a second fit into
    the folder writes ``last-v1.ckpt`` beside the first one's), else its newest checkpoint."""
    saved = folder / "checkpoints"
    found = _by_age(saved.glob("last*.ckpt")) or _by_age(saved.glob("*.ckpt"))
    if not found:
        raise FileNotFoundError(
            f"{setting}={str(folder)!r}: a folder with neither config.json + model.safetensors (save_pretrained) nor "
            "checkpoints/*.ckpt (a run): give a run folder, a .ckpt file, a save_pretrained folder or a Hub id"
        )
    return found[-1]


def load(path: str | Path, device: str | torch.device = "cpu", setting: str = "model") -> SplitModel:
    """A trained `SplitModel` in eval mode on ``device``.

    Args:
        path: a run folder (its ``checkpoints/last.ckpt``), a ``.ckpt`` written by any splitlab task,
            a folder written by ``save_pretrained``, or a Hugging Face Hub id (``owner/name``).
        device: where the model runs.
        setting: the option that named ``path``, for error messages.
    """
    where = Path(path).expanduser()
    if where.is_dir():
        if (where / "config.json").is_file():
            model = SplitModel.from_pretrained(str(where))
        else:
            model = from_checkpoint(run_checkpoint(where, setting), setting)
    elif where.is_file():
        model = from_checkpoint(where, setting)
    elif where.suffix == ".ckpt":
        raise FileNotFoundError(f"{setting}={str(path)!r}: no such checkpoint file")
    elif HUB_ID.match(str(path)):
        model = SplitModel.from_pretrained(str(path))
    else:
        raise FileNotFoundError(
            f"{setting}={str(path)!r}: no such file or folder (give a run folder, a .ckpt file, a "
            "save_pretrained folder or a Hugging Face Hub id owner/name)"
        )
    unfinished = model.unfinished()
    if unfinished:  # served, as it may be inspected, but never silently as a trained policy
        warnings.warn(f"{setting}={str(path)!r}: {unfinished}", stacklevel=2)
    return model.to(device).eval()
