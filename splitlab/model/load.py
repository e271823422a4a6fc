"""`splitlab.load`: a `SplitModel` from whatever a user has: a run folder, a training checkpoint, a
folder written by ``save_pretrained``, or a Hugging Face Hub id."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from splitlab.checkpoint import read_checkpoint
from splitlab.model.base import SplitModel, model_settings
from splitlab.model.preprocess import Preprocessing

# Checkpoints written before `SplitModel` kept the deployed parts at the task's top level.
LEGACY_PREFIXES = ("backbone.", "tokenizer.", "head.")
LEGACY_KEYS = ("apt_cuts", "apt_fraction")
# the task class of a checkpoint that predates the model's config, by class name
LEGACY_TASKS = {
    "ClassificationTask": "classification",
    "DetectionTask": "detection",
    "SegmentationTask": "segmentation",
    "VQATask": "vqa",
}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def legacy_key(key: str) -> str:
    """A task state-dict key of a checkpoint older than `SplitModel` -> today's (``model.`` + key)."""
    if key.startswith(LEGACY_PREFIXES) or key in LEGACY_KEYS:
        return "model." + key
    return key


def upgrade_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename, in place, the keys of a checkpoint written before `SplitModel` (the deployed parts
    moved under ``model.``); today's checkpoints come back unchanged."""
    if any(k.startswith("model.") for k in state):
        return state
    renamed = {legacy_key(k): v for k, v in state.items()}
    state.clear()
    state.update(renamed)
    return state


def legacy_config(checkpoint: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The model config of a checkpoint that predates it, from its task and data settings."""
    meta = checkpoint.get("splitlab", {})
    name = str(meta.get("task_class", "")).rpartition(".")[2]
    if name not in LEGACY_TASKS:
        raise ValueError(
            f"{source}: written by an older splitlab for task class {meta.get('task_class')!r}, whose model "
            "config it does not record; resume or validate it once with this version to rewrite it"
        )
    task = LEGACY_TASKS[name]
    hparams = dict(checkpoint.get("hyper_parameters", {}))
    config = model_settings(hparams, SplitModel.registry[task].head_keys)
    config.update(
        task=task, policy="uniform" if meta.get("stage") == "dense" else hparams.get("policy", "learned")
    )
    data = checkpoint.get("datamodule_hyper_parameters", {})
    if "img_size" in data and "mean" in data and "std" in data:
        base = {"size": int(data["img_size"]), "mean": data["mean"], "std": data["std"]}
        if task == "classification":
            extra = {
                "resize": "crop",
                "interpolation": data.get("interpolation", "bicubic"),
                "crop_pct": data.get("crop_pct", 0.875),
            }
        elif task == "segmentation":
            extra = {"pad_fill": "black"}
        else:
            extra = {"pad": data.get("pad", "corner")}
        config["preprocessing"] = Preprocessing(**base, **extra).to_dict()
    return config


def from_checkpoint(path: str | Path, setting: str = "checkpoint") -> SplitModel:
    """The `SplitModel` inside a splitlab training checkpoint (a ``.ckpt`` of any task)."""
    checkpoint = read_checkpoint(path, setting, mmap=True)
    meta = checkpoint.get("splitlab") if isinstance(checkpoint, dict) else None
    if meta is None or "state_dict" not in checkpoint:
        raise ValueError(f"{setting}={str(path)!r} was not written by a splitlab task")
    config = meta.get("model") or legacy_config(checkpoint, f"{setting}={str(path)!r}")
    state = upgrade_state_dict(dict(checkpoint["state_dict"]))
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
    return model.to(device).eval()
