"""The LightningCLI behind ``lightning fit --config tasks/coco.yaml`` (and ``splitlab fit ...``)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning import LightningDataModule, Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from splitlab.callbacks import LayoutWriter, ResumePosition, SplitSchedule
from splitlab.tasks import SplitTask

DEFAULT_CALLBACKS = (SplitSchedule, ResumePosition, LayoutWriter)
# Settings a run from a checkpoint may change: how the trained model is evaluated and deployed.
DEPLOYMENT = {
    "target_fraction",
    "eval_budgets",
    "eval_baselines",
    "max_fraction",
    "attn_backend",
    "calibration_images",
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


class SplitLabCLI(LightningCLI):
    """LightningCLI over any `SplitTask` and DataModule, adding the callbacks every run needs.

    A recipe that names no `SplitSchedule` gets the default one (1 warm-start epoch, then PPO);
    `ResumePosition` (exact mid-epoch resume) and `LayoutWriter` (``predict`` writes layouts) are
    added unless the recipe configures its own.
    """

    def _parse_ckpt_path(self) -> None:
        """Build the model as the checkpoint was trained, with the safe changes given (`reconcile`).

        Lightning's own version applies the checkpoint's hyperparameters over the command line,
        so ``--model.init_args.target_fraction 0.3`` with ``--ckpt_path`` silently ran at the
        checkpoint's budget.
        """
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        saved = dict(
            torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True).get(
                "hyper_parameters", {}
            )
        )
        saved.pop("_instantiator", None)
        class_path = saved.pop("_class_path", None)
        if not saved or class_path is None:
            return
        model = self.config[subcommand]["model"]
        if model.class_path != class_path:
            raise ValueError(
                f"ckpt_path={ckpt_path!r} holds a {class_path}, the config builds a {model.class_path}"
            )
        merged, notes = reconcile(subcommand, saved, model.init_args.as_dict())
        for note in notes:
            rank_zero_info(f"splitlab: from the checkpoint with {note}")
        update = {subcommand: {"model": {"class_path": class_path, "init_args": merged}}}
        self.config = self.parser.parse_object(update, self.config)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        given = kwargs.get("callbacks", self._get(self.config_init, "trainer", default={}).get("callbacks"))
        given = list(given) if isinstance(given, list | tuple) else ([given] if given else [])
        missing = [cls for cls in DEFAULT_CALLBACKS if not any(isinstance(c, cls) for c in given)]
        if SplitSchedule in missing and self.subcommand == "fit":
            rank_zero_info(
                "splitlab: no SplitSchedule in trainer.callbacks: using 1 warm-start epoch, then PPO"
            )
        return super().instantiate_trainer(**{**kwargs, "callbacks": given + [cls() for cls in missing]})


def lightning_main(args: Sequence[str] | None = None, run: bool = True) -> SplitLabCLI:
    """Run (or with ``run=False`` only build) the LightningCLI on ``args`` (``sys.argv`` when None)."""
    argv = sys.argv
    if args is not None:  # called from Python (demo, tests): the process's own argv is not ours
        sys.argv = argv[:1]
    try:
        return SplitLabCLI(
            SplitTask,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            args=list(args) if args is not None else None,
            run=run,
        )
    finally:
        sys.argv = argv


PACKAGE = str(Path(__file__).resolve().parent)
FILE_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps (jsonargparse and Lightning re-raise ours), outermost first."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _raised_by_splitlab(error: BaseException) -> bool:
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and last.tb_frame.f_code.co_filename.startswith(PACKAGE)


def user_error(error: BaseException) -> BaseException | None:
    """The exception to report as one line: the innermost one about a setting or a file.

    splitlab's own checks raise ``ValueError`` / ``TypeError`` / ``RuntimeError`` / ``OSError``
    messages that name the setting (with its value) or the file, and the fix; file errors from
    anywhere name their file. Anything else is a bug and keeps its traceback.
    """
    found = None
    for link in _chain(error):
        if isinstance(link, FILE_ERRORS) or (
            isinstance(link, ValueError | TypeError | RuntimeError | OSError | KeyError)
            and _raised_by_splitlab(link)
        ):
            found = link
    return found


def reporting_errors(run: Callable[[], Any]) -> Any:
    """Run ``run``; a bad setting or file ends the process with one line on stderr and exit code 2.

    ``SPLITLAB_DEBUG=1`` shows the full traceback instead.
    """
    try:
        return run()
    except Exception as error:
        cause = user_error(error)
        if cause is None or os.environ.get("SPLITLAB_DEBUG"):
            raise
        message = str(cause).strip() or type(cause).__name__
        if isinstance(cause, KeyError) and cause.args:
            message = str(cause.args[0])
        print(f"splitlab: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> None:
    """``lightning {fit,validate,test,predict} ...``: errors about settings and files as one line."""
    args = None if argv is None or list(argv) == sys.argv[1:] else list(argv)
    reporting_errors(lambda: lightning_main(args))


if __name__ == "__main__":
    main()
