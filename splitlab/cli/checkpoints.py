"""Runs from a checkpoint: which settings may differ from the trained ones, and the run's history."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger

# Settings a run from a checkpoint may change: how the trained model is evaluated and deployed.
DEPLOYMENT = {
    "target_fraction",
    "eval_budgets",
    "eval_baselines",
    "max_fraction",
    "attn_backend",
    "calibration_images",
    "vqa_accuracy_mode",
}
# Where the weights come from: a checkpoint restores them all, so these are not used.
WEIGHTS = {"pretrained", "checkpoint_path", "init_checkpoint"}
# Settings of training only: they do not change what validate, test and predict compute.
TRAINING = {
    "lr",
    "weight_decay",
    "warmup_steps",
    "policy_lr",
    "imitation_lr",
    "imitation_weight",
    "teacher_forcing",
    "label_target",
    "apt_search",
    "entropy_thresholds",
    "grad_clip",
    "ppo",
    "lambda_lr",
    "lambda_gain",
    "lambda_damping",
    "lambda_init",
    "sampling_seed",
    "label_smoothing",
    "aux_weight",
}


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
    differs = [k for k in saved if k in given and not _same(saved[k], given[k])]
    allowed = DEPLOYMENT | WEIGHTS | (TRAINING if subcommand != "fit" else set())
    refused = [k for k in differs if k not in allowed]
    if refused:
        listing = "; ".join(f"{k}: checkpoint {_shown(saved[k])}, given {_shown(given[k])}" for k in refused)
        raise ValueError(
            f"{subcommand} from a checkpoint: these settings differ from the ones it was trained with and "
            f"cannot change now: {listing}. Use the checkpoint's values (or start a new run)"
        )
    merged = {**saved, **{k: given[k] for k in differs if k in DEPLOYMENT}}
    merged.update(
        pretrained=False, checkpoint_path="", init_checkpoint=None
    )  # the checkpoint has the weights
    notes = [f"{k}={_shown(given[k])} (checkpoint {_shown(saved[k])})" for k in differs if k in DEPLOYMENT]
    ignored = [k for k in differs if k in TRAINING]
    if ignored:
        notes.append(f"not used by {subcommand}: {', '.join(ignored)}")
    return merged, notes


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
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    count = loops.get("epoch_loop.state_dict", {}).get("_batches_that_stepped")
    if count is None:
        return int(checkpoint.get("global_step", 0))
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
