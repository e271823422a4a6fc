"""What a `SplitTask` keeps and checks across runs, as plain objects and functions: the policy's
sampling stream, the weights a checkpoint leaves out to be rebuilt, the starting weights of an
``init_checkpoint``, what the data gives the model and whether it fits it. The checkpoint hooks that
use them are `splitlab.tasks.hooks.TaskHooks`'."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule
from torch import nn

from splitlab.checkpoint import plain, read_checkpoint, safe_checkpoint_globals
from splitlab.lightning_private import syncs_batchnorm
from splitlab.model.preprocess import Preprocessing, image_sides
from splitlab.tasks.logic import RunFacts, TaskLogic

__all__ = ["RebuiltWeights", "SamplingStream", "load_task", "read_checkpoint"]

# What of a model an init_checkpoint's weights depend on, as the model's config records it
ARCHITECTURE = ("task", "backbone", "backbone_kwargs", "levels", "head")


class SamplingStream:
    """The policy's sampling generator: seeded, on the model's device, its state in checkpoints.

    Each DDP rank has its own stream (the seed is offset by the rank), so the ranks' rollouts
    explore differently; all ranks' states go into the checkpoint, and each takes its own back.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._generator: torch.Generator | None = None
        self._pending: torch.Tensor | None = None

    def on(self, device: torch.device, rank: int) -> torch.Generator:
        """The stream of ``rank`` on ``device`` (a fresh one, seeded, after a move between devices)."""
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device).manual_seed(self.seed + 1_000_003 * rank)
            if self._pending is not None:
                self._generator.set_state(self._pending)
                self._pending = None
        return self._generator

    def resume(self, state: torch.Tensor | None) -> None:
        """Continue from a checkpointed state at the next use (None: start afresh from the seed)."""
        self._generator = None
        self._pending = state


class RebuiltWeights:
    """The state-dict keys a task rebuilds identically whenever it is built (a frozen language model
    loaded by name): checkpoints leave them out, and loading fills them back from the model as built;
    once a checkpoint carried such weights itself (an LM fine-tuned in an earlier stage), which its
    source cannot rebuild, they are saved from then on (``loaded``)."""

    def __init__(self, keys: set[str], model: Any) -> None:
        self.keys, self.model, self.loaded = set(keys), model, False

    def left_out(self) -> set[str]:
        """The keys a checkpoint may leave out now."""
        return set() if self.loaded else set(self.keys)

    def fill(self, state: dict[str, Any], meta: dict[str, Any], source: str, own: Callable[[], dict]) -> None:
        """Put back into ``state`` the weights ``source`` left out as rebuilt (``meta["rebuilt"]``) from
        the task's ``own`` state dict, and note when it carried such weights itself."""
        if not self.loaded and self.keys & set(state):
            self.loaded = self.model.rebuilt_loaded = True
        left_out = [k for k in meta.get("rebuilt", []) if k not in state]
        if not left_out:
            return
        mine = own()
        lacking = [k for k in left_out if k not in mine]
        if lacking:
            raise ValueError(
                f"{source} left out weights this model rebuilds itself ({lacking[:3]}), but this model has "
                "no such weights: build it with the settings the checkpoint was trained with (e.g. the same lm)"
            )
        state.update({k: mine[k] for k in left_out})


# a task's policy state: an init_checkpoint's weights start everything else
POLICY_STATE = (
    "model.tokenizer.decision.",
    "model.tokenizer.operating_points.",
    "controller.",
    "budget_sampler.",
    "model.apt_",
    "label_embedding.",
)


def load_init_weights(task: nn.Module, model: Any, rebuilt: RebuiltWeights, path: str) -> None:
    """Start ``task`` from a splitlab (or plain) state dict: backbone, head and embeddings; the policy
    (decision module, operating points, λ) starts fresh. Sizes or keys that do not fit are refused,
    naming the settings of ``model`` that differ from the checkpoint's."""
    saved = read_checkpoint(path, "init_checkpoint")
    if not isinstance(saved, dict):
        raise ValueError(
            f"init_checkpoint={path!r} holds a {type(saved).__name__}, not a state dict or a checkpoint"
        )
    weights = saved.get("state_dict", saved)
    state = {k: v for k, v in weights.items() if not k.startswith(POLICY_STATE)}
    rebuilt.fill(state, saved.get("splitlab", {}), f"init_checkpoint={path!r}", task.state_dict)
    own = task.state_dict()
    resized = [
        f"{k} {tuple(v.shape)} (this model: {tuple(own[k].shape)})"
        for k, v in state.items()
        if k in own and hasattr(v, "shape") and v.shape != own[k].shape
    ]
    if resized:  # torch's own error names neither the file nor the setting behind the shape
        raise ValueError(
            f"init_checkpoint={path!r} was trained with other sizes: {'; '.join(resized[:3])}"
            f"{settings_differing(model, saved)}; build this model with the settings of that run "
            "(backbone_kwargs, lm, num_classes, ...)"
        )
    missing, unexpected = task.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(POLICY_STATE)]
    if missing or unexpected:
        raise ValueError(
            f"init_checkpoint={path!r} does not fit this model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}{settings_differing(model, saved)}"
        )


def settings_differing(model: Any, saved: dict[str, Any]) -> str:
    """``"; its settings differ: ..."``: what of the model a checkpoint records (its task, backbone,
    sizes, head) differs from ``model``'s, for a refusal ("" when it records none)."""
    config = saved.get("splitlab", {}).get("model")
    if not isinstance(config, dict):
        return ""
    mine = model.export_config()
    differ = [
        f"{key} {json.dumps(config[key], default=str)} (this model: {json.dumps(mine.get(key), default=str)})"
        for key in ARCHITECTURE
        if key in config and json.dumps(config[key], default=str) != json.dumps(mine.get(key), default=str)
    ]
    return f"; its settings differ: {'; '.join(differ)}" if differ else ""


def adopt_data(model: Any, datamodule: Any) -> None:
    """Give ``model`` what the data says about its inputs: the preprocessing its evaluation transform
    applies, and the class or category names (kept in checkpoints and saved models)."""
    preprocessing = getattr(datamodule, "preprocessing", None)
    if isinstance(preprocessing, Preprocessing):
        model.preprocessing = preprocessing
    names = getattr(datamodule, "names", None)
    if names:
        model.names = list(names)
    category_ids = getattr(datamodule, "category_ids", None)
    if category_ids and "category_ids" in model.config["head"]:  # a detector's (COCO results files)
        model.set_head_settings(replace(model.head_settings, category_ids=list(category_ids)))


def check_task_data(
    task_name: str, model: Any, hparams: Any, logic: TaskLogic, datamodule: Any, run: RunFacts
) -> None:
    """Refuse ``datamodule`` where it does not fit the run (``model``'s image size, the annotations
    the settings ``hparams`` ask for) or ``logic``, the task it feeds (classes, then the task's own
    checks); ``task_name`` names the task class in the refusal."""
    size = getattr(datamodule, "img_size", None)
    height, width = model.backbone.img_size
    sides = None if size is None else image_sides(size, "data.init_args.img_size")
    if sides is not None and sides != (height, width):
        raise ValueError(
            f"data.init_args.img_size={size} differs from the model's input size {height}x{width} "
            "(model.init_args.backbone_kwargs.img_size): set both to the same size"
        )
    wanted = [
        setting
        for setting, asks in (
            ("warm_start.label_source=annotations", hparams.warm_start.label_source == "annotations"),
            ("evaluation.eval_baselines with oracle", "oracle" in hparams.evaluation.eval_baselines),
        )
        if asks
    ]
    if wanted and not getattr(datamodule, "object_annotations", False):
        raise ValueError(
            f"model.init_args.{' and model.init_args.'.join(wanted)} need annotations that say where the objects are, and "
            f"this data gives none to {task_name} (classification: data.init_args.objects, a "
            "file of object boxes); drop the setting or give the annotations"
        )
    classes, mine = getattr(datamodule, "num_classes", None), logic.num_classes
    if classes and mine is not None and int(classes) != int(mine):
        raise ValueError(
            f"the data has {classes} classes but model.init_args.num_classes={mine}: "
            f"set model.init_args.num_classes={classes} (or check data.init_args.root)"
        )
    logic.check_data(datamodule, run)


def run_facts(trainer: Any) -> RunFacts:
    """What a task's data check reads of the trainer (None: not fitting, one rank)."""
    if trainer is None:
        return RunFacts()
    return RunFacts(trainer.state.fn == "fit", trainer.world_size, syncs_batchnorm(trainer))


def load_task(path: str | Path, map_location: Any = "cpu", setting: str = "checkpoint") -> Any:
    """Load any splitlab task checkpoint (the task class is recorded in it); ``setting`` names the
    option that gave ``path`` in errors."""
    file = Path(path)
    # mmap: the metadata without reading the weights, which load_from_checkpoint reads next
    checkpoint = read_checkpoint(file, setting, mmap=True)
    meta = checkpoint.get("splitlab", {}) if isinstance(checkpoint, dict) else {}
    if "task_class" not in meta:
        raise ValueError(f"{setting}={str(path)!r} was not written by a splitlab task")
    module, _, name = meta["task_class"].rpartition(".")
    if module.partition(".")[0] != "splitlab" and module not in sys.modules:
        # a file names what to import: splitlab's own modules, or one the user has imported already
        raise ValueError(
            f"{setting}={str(path)!r} names task class {meta['task_class']!r} of a module not imported "
            f"here: splitlab imports only its own on a checkpoint's word; import {module} first"
        )
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, LightningModule)):
        raise ValueError(
            f"{setting}={str(path)!r} names task class {meta['task_class']!r}, which splitlab lacks"
        )
    # a settings group a task built in Python kept as its dataclass: passed on as its fields, as the
    # CLI's instantiator reads every group
    hparams = checkpoint.get("hyper_parameters", {})
    groups = {k: plain(v) for k, v in hparams.items() if is_dataclass(v) and not isinstance(v, type)}
    with safe_checkpoint_globals():  # read as `read_checkpoint` read it: the file holds nothing else
        return cls.load_from_checkpoint(file, map_location=map_location, weights_only=True, **groups)
