"""What a `SplitTask` keeps and checks across runs: checkpoints, the policy's generator, data fit."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule
from lightning.pytorch.utilities import rank_zero_warn

from splitlab.checkpoint import plain, read_checkpoint, safe_checkpoint_globals
from splitlab.lightning_private import attached_trainer, syncs_batchnorm
from splitlab.model.preprocess import Preprocessing, image_sides
from splitlab.tasks.logic import RunFacts, TaskLogic

__all__ = ["SamplingStream", "TaskState", "load_task", "read_checkpoint"]

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


class TaskState:
    """What a `SplitTask` keeps and checks across runs: the checkpoint entry (stage, sampling
    streams, task class), starting weights, and the checks that a checkpoint and a data module fit
    the model before work starts.

    Owns whether rebuilt weights were loaded; uses of its task only what `SplitTask` defines
    (``model`` and its parts, ``stage``, ``sampling``, ``generator``, ``rank``) and Lightning's.
    """

    def __init__(self) -> None:
        super().__init__()
        self._rebuilt_weights_loaded = False  # see saved_as_rebuilt

    def _generator_states(self) -> list[torch.Tensor]:
        """Every rank's generator state (gathered: only rank 0 writes the checkpoint)."""
        state = self.generator.get_state()
        if attached_trainer(self) is None or self.trainer.world_size == 1:
            return [state]
        gathered = self.trainer.strategy.all_gather(state.to(self.device))
        # clone: a generator's set_state reads a row view of one shared storage wrongly (segfault)
        return [g.cpu().clone() for g in gathered.reshape(self.trainer.world_size, -1)]

    @property
    def num_classes(self) -> int | None:
        """Classes of the task's head (None where the task has no class count)."""
        return self.logic.num_classes

    def setup(self, stage: str) -> None:
        if attached_trainer(self) is None:
            return
        precision = str(self.trainer.precision)
        if stage == "fit" and precision.startswith("16"):
            raise ValueError(
                f"trainer.precision={precision}: float16 training is not supported (two optimisers step per "
                "batch, task and policy, and Lightning's manual optimisation neither unscales before clipping "
                "nor updates the loss scale once for both): use bf16-mixed (the recipes') or 32-true"
            )
        dm = self.trainer.datamodule
        if dm is not None:
            self.check_data(dm)
            self.adopt_data(dm)

    def adopt_data(self, datamodule: Any) -> None:
        """Give the model what the data says about its inputs: the preprocessing its evaluation
        transform applies, and the class or category names (kept in checkpoints and saved models)."""
        preprocessing = getattr(datamodule, "preprocessing", None)
        if isinstance(preprocessing, Preprocessing):
            self.model.preprocessing = preprocessing
        names = getattr(datamodule, "names", None)
        if names:
            self.model.names = list(names)
        category_ids = getattr(datamodule, "category_ids", None)
        if category_ids:
            self.model.config["head"]["category_ids"] = list(category_ids)

    def check_data(self, datamodule: Any) -> None:
        """Refuse data that does not fit the model, before any work (Lightning sets the data up first)."""
        self.check_task_data(self.logic, datamodule)

    def check_task_data(self, logic: TaskLogic, datamodule: Any) -> None:
        """Refuse ``datamodule`` where it does not fit the run (image size, the annotations its settings
        ask for) or ``logic``, the task it feeds (classes, then the task's own checks)."""
        size = getattr(datamodule, "img_size", None)
        height, width = self.backbone.img_size
        sides = None if size is None else image_sides(size, "data.init_args.img_size")
        if sides is not None and sides != (height, width):
            raise ValueError(
                f"data.init_args.img_size={size} differs from the model's input size {height}x{width} "
                "(model.init_args.backbone_kwargs.img_size): set both to the same size"
            )
        hp = self.hparams
        wanted = [
            setting
            for setting, asks in (
                ("warm_start.label_source=annotations", hp.warm_start.label_source == "annotations"),
                ("evaluation.eval_baselines with oracle", "oracle" in hp.evaluation.eval_baselines),
            )
            if asks
        ]
        if wanted and not getattr(datamodule, "object_annotations", False):
            raise ValueError(
                f"model.init_args.{' and model.init_args.'.join(wanted)} need annotations that say where the objects are, and "
                f"this data gives none to {type(self).__name__} (classification: data.init_args.objects, a "
                "file of object boxes); drop the setting or give the annotations"
            )
        classes, mine = getattr(datamodule, "num_classes", None), logic.num_classes
        if classes and mine is not None and int(classes) != int(mine):
            raise ValueError(
                f"the data has {classes} classes but model.init_args.num_classes={mine}: "
                f"set model.init_args.num_classes={classes} (or check data.init_args.root)"
            )
        logic.check_data(datamodule, self.run_facts())

    def run_facts(self) -> RunFacts:
        """What a task's data check reads of the trainer (none attached: not fitting, one rank)."""
        trainer = attached_trainer(self)
        if trainer is None:
            return RunFacts()
        return RunFacts(trainer.state.fn == "fit", trainer.world_size, syncs_batchnorm(trainer))

    def rebuilt_keys(self) -> set[str]:
        """State-dict keys the task rebuilds identically whenever it is built (e.g. a frozen language
        model loaded by name): checkpoints leave them out and loading fills them back from the model
        as built. None by default."""
        return set()

    def saved_as_rebuilt(self) -> set[str]:
        """The `rebuilt_keys` checkpoints may leave out: none once weights for them came from a
        checkpoint (e.g. an LM fine-tuned in an earlier stage), which the source cannot rebuild."""
        return set() if self._rebuilt_weights_loaded else self.rebuilt_keys()

    def _fill_rebuilt(self, state: dict[str, Any], meta: dict[str, Any], source: str) -> None:
        """Put back into ``state`` the weights a checkpoint left out as rebuilt (``meta["rebuilt"]``),
        and note when it carried such weights itself (then they are saved from now on)."""
        if not self._rebuilt_weights_loaded and self.rebuilt_keys() & set(state):
            self._rebuilt_weights_loaded = self.model.rebuilt_loaded = True
        left_out = [k for k in meta.get("rebuilt", []) if k not in state]
        if not left_out:
            return
        own = self.state_dict()
        lacking = [k for k in left_out if k not in own]
        if lacking:
            raise ValueError(
                f"{source} left out weights this model rebuilds itself ({lacking[:3]}), but this model has "
                "no such weights: build it with the settings the checkpoint was trained with (e.g. the same lm)"
            )
        state.update({k: own[k] for k in left_out})

    def load_init_checkpoint(self, path: str) -> None:
        """Start from a splitlab (or plain) state dict: backbone, head and embeddings; the policy
        (decision module, operating points, λ) starts fresh."""
        saved = read_checkpoint(path, "init_checkpoint")
        if not isinstance(saved, dict):
            raise ValueError(
                f"init_checkpoint={path!r} holds a {type(saved).__name__}, not a state dict or a checkpoint"
            )
        policy = (
            "model.tokenizer.decision.",
            "model.tokenizer.operating_points.",
            "controller.",
            "budget_sampler.",
            "model.apt_",
            "label_embedding.",
        )
        weights = saved.get("state_dict", saved)
        state = {k: v for k, v in weights.items() if not k.startswith(policy)}
        self._fill_rebuilt(state, saved.get("splitlab", {}), f"init_checkpoint={path!r}")
        own = self.state_dict()
        resized = [
            f"{k} {tuple(v.shape)} (this model: {tuple(own[k].shape)})"
            for k, v in state.items()
            if k in own and hasattr(v, "shape") and v.shape != own[k].shape
        ]
        if resized:  # torch's own error names neither the file nor the setting behind the shape
            raise ValueError(
                f"init_checkpoint={path!r} was trained with other sizes: {'; '.join(resized[:3])}"
                f"{self.settings_differing(saved)}; build this model with the settings of that run "
                "(backbone_kwargs, lm, num_classes, ...)"
            )
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(policy)]
        if missing or unexpected:
            raise ValueError(
                f"init_checkpoint={path!r} does not fit this model: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}{self.settings_differing(saved)}"
            )

    def settings_differing(self, saved: dict[str, Any]) -> str:
        """``"; its settings differ: ..."``: what of the model a checkpoint records (its task,
        backbone, sizes, head) differs from this model's, for a refusal ("" when it records none)."""
        config = saved.get("splitlab", {}).get("model")
        if not isinstance(config, dict):
            return ""
        mine = self.model.export_config()
        differ = [
            f"{key} {json.dumps(config[key], default=str)} (this model: {json.dumps(mine.get(key), default=str)})"
            for key in ARCHITECTURE
            if key in config
            and json.dumps(config[key], default=str) != json.dumps(mine.get(key), default=str)
        ]
        return f"; its settings differ: {'; '.join(differ)}" if differ else ""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the settings groups as plain mappings: a checkpoint holds data, never a class to import
        checkpoint["hyper_parameters"] = plain(checkpoint.get("hyper_parameters", {}))
        self.model.trained = self.algorithm.progress.record()  # what `holds` reports
        checkpoint["splitlab"] = {
            "task_class": f"{type(self).__module__}.{type(self).__qualname__}",
            **self.algorithm.progress.record(),
            "generators": self._generator_states(),
            "model": self.model.export_config(),  # what `splitlab.load` rebuilds the model from
        }
        rebuilt = self.saved_as_rebuilt()
        if rebuilt:
            weights = checkpoint.get("state_dict", {})
            for key in rebuilt:
                weights.pop(key, None)
            checkpoint["splitlab"]["rebuilt"] = sorted(rebuilt)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trained = checkpoint.get("state_dict", {}).get("model.tokenizer.operating_points.budgets")
        mine = self.tokenizer.operating_points.budgets
        if trained is not None and (
            trained.shape != mine.shape or not torch.allclose(trained.cpu(), mine.cpu())
        ):
            lo, hi = float(trained[0]), float(trained[-1])
            span = (
                f"[{lo:g}, {hi:g}] (budget_range: [{lo:g}, {hi:g}])" if len(trained) > 1 else f"{lo:g} only"
            )
            raise ValueError(
                f"the checkpoint's policy was trained for budgets {span}; this run asks for "
                f"budget={self.budget:g} with budget_range={self.hparams.budget_range}: "
                "use the checkpoint's budget_range, and a budget inside it"
            )
        state = checkpoint.get("splitlab", {})
        if "state_dict" in checkpoint:
            self._fill_rebuilt(checkpoint["state_dict"], state, "the checkpoint")
        saved = state.get("model", {})
        if saved.get("preprocessing"):  # a data module, when there is one, sets them again at setup
            self.model.preprocessing = Preprocessing.from_dict(saved["preprocessing"])
        if saved.get("names"):
            self.model.names = list(saved["names"])
        if saved.get("head", {}).get("category_ids"):
            self.model.config["head"]["category_ids"] = list(saved["head"]["category_ids"])
        if self.algorithm.progress.restore(state):
            self.sync_deployed()
        states = state.get("generators", [])
        ranks = self.trainer.world_size if attached_trainer(self) is not None else 1
        if states and len(states) != ranks:
            rank_zero_warn(
                f"the checkpoint was saved by {len(states)} rank(s), this run has {ranks}: the sampling "
                "streams of ranks it lacks start fresh, and a mid-epoch resume skips another share of the "
                f"data; resume on {len(states)} rank(s) to continue exactly"
            )
        if states:
            self.sampling.resume(states[self.rank].clone() if self.rank < len(states) else None)


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
