"""Runs from a checkpoint: which checkpoint (``--ckpt_path last``, a requeued SLURM job's), which
settings may differ from the trained ones, and the run's history."""

from __future__ import annotations

import csv
import json
import re
import warnings
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from splitlab.checkpoint import UnsafeCheckpoint
from splitlab.cli.runs import version_folder
from splitlab.lightning_private import batches_that_stepped
from splitlab.tasks import read_checkpoint

HPC_NAME = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


def hpc_checkpoints(root: Path) -> list[Path]:
    """The ``hpc_ckpt_N.ckpt`` files SLURM requeues leave in ``root``, by N."""
    numbered = [
        (int(m.group(1)), p) for p in root.glob("hpc_ckpt_*.ckpt") if (m := HPC_NAME.fullmatch(p.name))
    ]
    return [p for _, p in sorted(numbered)]


def requeued_checkpoint(subcommand: str, trainer: Any) -> str | None:
    """The checkpoint a requeued SLURM job resumes from: it starts with the same command (no
    ``--ckpt_path``) and Lightning takes the newest ``hpc_ckpt_N.ckpt`` of ``default_root_dir``
    by itself. Named here, the resume gets what any resume gets: settings checked against the
    checkpoint, and the run's ``metrics.csv`` history kept (Lightning's writer deletes it).

    Args:
        subcommand: the LightningCLI subcommand (only ``fit`` resumes by itself).
        trainer: the subcommand's ``trainer`` settings.
    """
    if subcommand != "fit" or not SLURMEnvironment.detect():
        return None
    numbered = hpc_checkpoints(Path(trainer.get("default_root_dir") or "."))
    if not numbered:
        return None
    path = str(numbered[-1])  # the highest N, as Lightning picks
    rank_zero_info(f"splitlab: requeued SLURM job: resuming from {path}")
    return path


def resolve_last(trainer: Any, which: str) -> str:
    """``--ckpt_path last``: the newest checkpoint under the run directory the recipe's logger names.

    Lightning looks only in *this* run's (new, empty) ``version_N``, finds nothing, warns and
    trains from scratch; here every version of the recipe's run is searched, the newest
    checkpoint wins (``interrupted.ckpt`` included), and the logger continues in its version
    (``trainer``'s logger settings are changed to it).

    Args:
        trainer: the subcommand's ``trainer`` settings.
        which: ``"last"``, or ``"hpc"`` to search ``default_root_dir``'s ``hpc_ckpt_N.ckpt`` too.
    """
    root = Path(trainer.get("default_root_dir") or ".")
    logger = trainer.get("logger")
    named = getattr(logger, "init_args", None)
    if named is not None and named.get("save_dir") is not None:
        base = Path(named.save_dir) / (named.get("name") or "")
        version = named.get("version")
        # no version: a new version_N each run, so search them all; else the logger's own folder
        # ("" is the base itself, an int is version_<int>)
        folders = sorted(base.glob("version_*")) if version is None else [base / version_folder(version)]
    else:
        named, base = None, root
        folders = [root, *sorted((root / "lightning_logs").glob("version_*"))]
    found = [p for folder in folders for p in (folder / "checkpoints").glob("*.ckpt")]
    if which == "hpc":
        found += hpc_checkpoints(root)
    if not found:
        raise FileNotFoundError(
            f"ckpt_path={which}: no checkpoint under {base} (searched {len(folders)} run folder(s)); "
            "nothing to resume: run without --ckpt_path to start, or give the checkpoint file"
        )
    newest = newest_readable(sorted(found, key=lambda p: p.stat().st_mtime), which)
    if named is not None and newest.parent.parent.parent == base:
        named.version = newest.parent.parent.name  # the logger continues in the resumed run's folder
    rank_zero_info(f"splitlab: ckpt_path={which}: resuming from {newest}")
    return str(newest)


def newest_readable(found: list[Path], which: str) -> Path:
    """The newest checkpoint of ``found`` (oldest first) that reads (its header: the weights are not
    loaded), warning about each newer one that does not (a save that a crash or a full disk cut short)."""
    for path in reversed(found):
        try:
            read_checkpoint(path, "ckpt_path", mmap=True)
        except UnsafeCheckpoint:  # not a save cut short: never passed over for an older one in silence
            raise
        except (ValueError, OSError) as err:
            rank_zero_warn(f"splitlab: ckpt_path={which}: skipping {path}, which does not read ({err})")
            continue
        return path
    raise FileNotFoundError(
        f"ckpt_path={which}: none of the {len(found)} checkpoint(s) found reads (the newest: {found[-1]}); "
        "give a checkpoint file, or run without --ckpt_path to start afresh"
    )


# Settings a run from a checkpoint may change: how the trained model is evaluated and deployed (a
# group's field as ``group.field``).
DEPLOYMENT = {
    "budget",
    "max_fraction",
    "evaluation.eval_budgets",
    "evaluation.eval_baselines",
    "evaluation.calibration_images",
    "backbone_kwargs.attn_backend",
    "vqa_accuracy_mode",
}
# Where the weights come from: a checkpoint restores them all, so these are not used.
WEIGHTS = {"pretrained", "backbone_kwargs.checkpoint_path", "init_checkpoint"}
# Settings of training only: they do not change what validate, test and predict compute.
TRAINING = {
    *(f"optim.{f}" for f in ("lr", "weight_decay", "warmup_steps", "policy_lr", "grad_clip")),
    *(
        f"warm_start.{f}"
        for f in ("imitation_lr", "imitation_weight", "teacher_forcing", "finetune", "label_target")
    ),
    *(f"controller.{f}" for f in ("lr", "gain", "damping", "init")),
    *(f"policy_options.{f}" for f in ("apt_search", "entropy_thresholds", "sampling_seed")),
    "ppo",
    "detector",
    "label_smoothing",
    "aux_weight",
}
# settings held as groups (mappings, as a config and `saved_model_settings` give them): compared field by field
NESTED = (
    "backbone_kwargs",
    "tokenizer",
    "evaluation",
    "policy_options",
    "optim",
    "warm_start",
    "ppo",
    "detector",
    "controller",
)


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with each group's fields as ``group.field``."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key in NESTED and isinstance(value, dict):
            flat.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            flat[key] = value
    return flat


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """`_flat` undone: each group a mapping of its fields."""
    settings: dict[str, Any] = {}
    for key, value in flat.items():
        group, dot, name = key.partition(".")
        if dot and group in NESTED:
            settings.setdefault(group, {})[name] = value
        else:
            settings[key] = value
    return settings


def _in(key: str, names: set[str]) -> bool:
    """Whether a setting (``group.field``) is one of ``names`` or in a group listed whole."""
    return key in names or key.partition(".")[0] in names


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)


def reconcile(
    subcommand: str, saved: dict[str, Any], given: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The model settings of a run from a checkpoint: the checkpoint's, with the given changes that are safe.

    Deployment settings given on the command line take effect; settings of training only are
    noted and ignored outside ``fit``; every other difference (architecture, budgets, or training
    settings on a resumed fit) is refused with a message listing what differs, since the restored
    weights, optimizer and multipliers would silently keep the checkpoint's values.

    Returns:
        the settings to build the model with, and notes for the user.
    """
    saved, given = _flat(saved), _flat(given)
    differs = [k for k in saved if k in given and not _same(saved[k], given[k])]
    allowed = DEPLOYMENT | WEIGHTS | (TRAINING if subcommand != "fit" else set())
    refused = [k for k in differs if not _in(k, allowed)]
    if refused:
        listing = "; ".join(f"{k}: checkpoint {_shown(saved[k])}, given {_shown(given[k])}" for k in refused)
        raise ValueError(
            f"{subcommand} from a checkpoint: these settings differ from the ones it was trained with and "
            f"cannot change now: {listing}. Use the checkpoint's values (or start a new run)"
        )
    merged = {**saved, **{k: given[k] for k in differs if k in DEPLOYMENT}}
    merged.update(pretrained=False, init_checkpoint=None)  # the checkpoint has the weights
    merged.pop("backbone_kwargs.checkpoint_path", None)
    notes = [f"{k}={_shown(given[k])} (checkpoint {_shown(saved[k])})" for k in differs if k in DEPLOYMENT]
    ignored = [k for k in differs if _in(k, TRAINING)]
    if ignored:
        notes.append(f"not used by {subcommand}: {', '.join(ignored)}")
    return _nested(merged), notes


# Data settings a resumed fit cannot change: they fix which samples of the epoch the checkpoint has
# already seen (`ResumePosition` skips batches x batch_size of the epoch's seeded order) and how
# many steps the learning-rate schedules span.
DATA_ORDER = {"batch_size", "shuffle_seed"}


def reconcile_data(saved: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The data settings of a resumed fit: a change to `DATA_ORDER` is refused, any other (a moved
    ``root``, more ``num_workers``) takes effect and is noted.

    Returns:
        notes for the user.
    """
    differs = [k for k in saved if not k.startswith("_") and k in given and not _same(saved[k], given[k])]
    refused = [k for k in differs if k in DATA_ORDER]
    if refused:
        listing = "; ".join(
            f"data.init_args.{k}: checkpoint {_shown(saved[k])}, given {_shown(given[k])}" for k in refused
        )
        raise ValueError(
            f"fit from a checkpoint: {listing}. These fix which samples the resumed epoch has already "
            "seen and the schedules' length: resume with the checkpoint's values (or start a new run)"
        )
    return [f"data.init_args.{k}={_shown(given[k])} (checkpoint {_shown(saved[k])})" for k in differs]


def logged_step(checkpoint: dict[str, Any]) -> int:
    """The last logging step whose rows a checkpoint's training includes.

    Lightning logs a batch's rows at the count of batches that stepped before it (not at
    ``global_step``, which counts every optimizer step: 2 per warm-start batch, more in PPO), and
    raises the count after the batch's hooks. A checkpoint written at the end of an epoch holds
    the raised count, so its rows end one step below it; one written inside a batch's hooks (a
    graceful stop) holds the count of that batch, whose rows are in.
    """
    count = batches_that_stepped(checkpoint)
    if count is None:
        return int(checkpoint.get("global_step", 0))
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    current = loops.get("epoch_loop.batch_progress", {}).get("current", {})
    inside_a_batch = current.get("processed", 0) > current.get("completed", 0)
    return int(count) if inside_a_batch else int(count) - 1


def keep_csv_history(logger: CSVLogger, up_to_step: int) -> None:
    """Keep the rows of an existing ``metrics.csv`` up to ``up_to_step`` when a run resumes into it."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), list(reader)
    rows = [r for r in rows if not r.get("step") or int(float(r["step"])) <= up_to_step]
    with warnings.catch_warnings():  # the old file's rows are kept below, as the resume wants
        warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
        writer = logger.experiment  # creating the writer removes the old file
    writer.metrics_keys = sorted(set(writer.metrics_keys) | set(header))
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=writer.metrics_keys)
        out.writeheader()
        out.writerows(rows)
