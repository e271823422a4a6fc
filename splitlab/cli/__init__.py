"""The LightningCLI behind ``lightning fit --config tasks/coco.yaml`` (and ``splitlab fit ...``)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from jsonargparse import Namespace
from lightning import LightningDataModule, Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from splitlab.callbacks import GracefulStop, install_safe_checkpoints, missing_run_callbacks
from splitlab.cli.checkpoints import (
    keep_csv_history,
    logged_step,
    reconcile,
    reconcile_data,
    requeued_checkpoint,
    resolve_last,
)
from splitlab.cli.errors import reporting_errors, user_error
from splitlab.cli.links import LINKED, data_settings, model_input_size, refuse_linked_settings, task_classes
from splitlab.cli.runs import (
    evaluation_folder,
    lock_run,
    logger_folder,
    refuse_taken,
    release_runs,
)
from splitlab.lightning_private import CheckpointConfigHook, cli_setting, saved_model_settings
from splitlab.tasks import SplitTask, read_checkpoint

__all__ = ["SplitLabCLI", "lightning_main", "main", "reporting_errors", "stop_code", "user_error"]


class SplitLabCLI(CheckpointConfigHook, LightningCLI):
    """LightningCLI over any `SplitTask` and DataModule, adding the callbacks every run needs.

    The run's callbacks (`splitlab.callbacks.RUN_CALLBACKS`: the schedule, 1 warm-start epoch then PPO
    unless the recipe names a `SplitSchedule`; exact resume; layouts in predict; a checkpoint on
    SIGTERM / Ctrl-C; skipped-sample counts; verified checkpoint writes) are added unless the recipe
    configures its own, as `SplitTask.configure_callbacks` adds them to a plain ``Trainer``.
    ``--ckpt_path last`` finds the newest checkpoint of the recipe's run directory.
    """

    def add_arguments_to_parser(self, parser: Any) -> None:
        """One setting per quantity: the data's ``num_classes`` (where it has one: segmentation) and
        ``img_size`` follow the model's, so a recipe states each once (`splitlab.cli.links`)."""
        parser.link_arguments(LINKED["num_classes"], "data.init_args.num_classes", apply_on="parse")
        parser.link_arguments(
            LINKED["img_size"], "data.init_args.img_size", compute_fn=model_input_size, apply_on="parse"
        )
        # a multi-task run's: each task's class count, for that task's data module
        parser.link_arguments(
            LINKED["task_classes"], "data.init_args.task_classes", compute_fn=task_classes, apply_on="parse"
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse as Lightning does, refusing a data setting that differs from the model's (a link
        would drop it without a word), and without Lightning's warning about ``args`` beside ``sys.argv``:
        `lightning_main` sets ``sys.argv`` to the same arguments, for the DDP launcher's ranks."""
        objects = isinstance(args, dict | Namespace)
        self.config = parser.parse_object(args) if objects else parser.parse_args(args)
        refuse_linked_settings(args if args is not None else sys.argv[1:], data_settings(self.config))

    def config_from_checkpoint(self) -> None:
        """Build the model as the checkpoint was trained, with the safe changes given (`reconcile`).

        Lightning's own version applies the checkpoint's hyperparameters over the command line,
        so ``--model.init_args.budget 0.3`` with ``--ckpt_path`` silently ran at the
        checkpoint's budget. A missing or unreadable file is named here, before anything is built.
        """
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        settings = self.config[subcommand]
        ckpt_path = settings.get("ckpt_path") or requeued_checkpoint(subcommand, settings["trainer"])
        if not ckpt_path:
            return
        if ckpt_path in ("last", "hpc"):
            ckpt_path = resolve_last(settings["trainer"], ckpt_path)
        settings["ckpt_path"] = ckpt_path
        checkpoint = read_checkpoint(ckpt_path, "ckpt_path", mmap=True)
        self._resume_step = logged_step(checkpoint) if subcommand == "fit" else None
        data = settings.get("data")
        data_notes = []
        if subcommand == "fit" and getattr(data, "init_args", None) is not None:
            saved_data = checkpoint.get("datamodule_hyper_parameters", {})
            data_notes = reconcile_data(saved_data, data.init_args.as_dict())
        class_path, saved = saved_model_settings(checkpoint)
        if not saved or class_path is None:
            return
        model = settings["model"]
        if model.class_path != class_path:
            raise ValueError(
                f"ckpt_path={ckpt_path!r} holds a {class_path}, the config builds a {model.class_path}"
            )
        merged, notes = reconcile(subcommand, saved, model.init_args.as_dict())
        for note in notes + data_notes:
            rank_zero_info(f"splitlab: from the checkpoint with {note}")
        update = {subcommand: {"model": {"class_path": class_path, "init_args": merged}}}
        self.config = self.parser.parse_object(update, self.config)

    def before_instantiate_classes(self) -> None:
        """One run, one folder (`splitlab.cli.runs`): a fresh fit into a folder that holds a run is
        refused, a fit locks its folder, and validate / test / predict write into a subfolder of
        the run they read, never over its files."""
        subcommand = self.subcommand
        if subcommand is None:  # built without running (run=False): nothing will be written
            return
        trainer = self.config[subcommand]["trainer"]
        if subcommand in ("validate", "test", "predict"):
            folder = evaluation_folder(trainer, subcommand)
            if folder is not None:
                rank_zero_info(
                    f"splitlab: {subcommand} writes into {folder} (the run in {folder.parent} is left as it is)"
                )
            return
        run = logger_folder(trainer) if subcommand == "fit" else None
        if run is None:
            return
        # Lightning warns that it will delete the log files of a non-empty folder; here the folder
        # holds no other run's (checked below), only this run's lock or the history a resume keeps
        warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
        if not self.config[subcommand].get("ckpt_path"):  # a resume continues the run in its folder
            refuse_taken(run)  # on every rank alike (srun starts them together), before any writes
        lock_run(run)  # rank 0's

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        given = kwargs.get(
            "callbacks", cli_setting(self, self.config_init, "trainer", default={}).get("callbacks")
        )
        given = list(given) if isinstance(given, list | tuple) else ([given] if given else [])
        missing = missing_run_callbacks(given, fitting=self.subcommand == "fit")
        trainer = super().instantiate_trainer(**{**kwargs, "callbacks": given + missing})
        install_safe_checkpoints(trainer)  # now, not at setup: a recipe's own callbacks see it there
        return trainer

    def before_fit(self) -> None:
        """A resumed fit keeps the history of its ``metrics.csv`` (Lightning's CSV writer deletes it)."""
        step = getattr(self, "_resume_step", None)
        if not self.trainer.is_global_zero:  # other ranks' loggers write nothing (a dummy experiment)
            return
        for logger in self.trainer.loggers if step is not None else []:
            if isinstance(logger, CSVLogger):
                keep_csv_history(logger, step)


def lightning_main(args: Sequence[str] | None = None, run: bool = True) -> SplitLabCLI:
    """Run (or with ``run=False`` only build) the LightningCLI on ``args`` (``sys.argv`` when None)."""
    argv = sys.argv
    if args is not None:  # called from Python (demo, curve): these arguments are the command
        # Lightning's DDP launcher starts the other ranks as ``sys.argv``: they must run this
        # command (``splitlab validate ...``), not the caller's (a bare ``splitlab`` failed)
        sys.argv = [argv[0], *args]
    try:
        return SplitLabCLI(
            SplitTask,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False},
            auto_configure_optimizers=False,
            args=list(args) if args is not None else None,
            run=run,
        )
    finally:
        sys.argv = argv
        release_runs()


def stop_code(cli: Any) -> int:
    """The exit code a signal left (128 + signal) when a `GracefulStop` ended the run early, else 0."""
    callbacks = getattr(getattr(cli, "trainer", None), "callbacks", [])
    return max((c.exit_code for c in callbacks if isinstance(c, GracefulStop)), default=0)


def main(argv: Sequence[str] | None = None) -> None:
    """``lightning {fit,validate,test,predict} ...``: errors about settings and files as one line."""
    args = None if argv is None or list(argv) == sys.argv[1:] else list(argv)
    try:
        cli = reporting_errors(lambda: lightning_main(args), argv=sys.argv[1:] if args is None else args)
    finally:  # on the error path too (its one line ends in sys.exit): a process group left to
        # interpreter exit is torn down in varying order and its threads end in
        # "terminate called without an active exception" after the one line
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    code = stop_code(cli)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
