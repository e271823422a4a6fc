"""Nothing lost silently: a stop signal leaves a checkpoint, a checkpoint that cannot be written stops
the run, skipped samples are reported."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from splitlab.checkpoint import read_checkpoint, safe_checkpoint_globals
from splitlab.lightning_private import count_as_saved, skip_next_validation


class GracefulStop(Callback):
    """On SIGTERM or Ctrl-C during fit: finish the batch, save a checkpoint, stop.

    The signal handler only raises a flag (saving inside it could catch PPO half-way through its
    updates, or ranks between collectives); at the end of the batch the ranks agree (a max
    all-reduce, so one signalled rank suffices), every rank takes part in
    ``trainer.save_checkpoint`` to ``<checkpoints>/interrupted.ckpt``, and training stops; the
    command then exits with ``128 + signal``. ``--ckpt_path last`` (or that file) resumes the
    run. A second Ctrl-C stops at once. The handlers are installed when training starts, after
    Lightning's own (which would end the run at the next batch without a checkpoint).

    Args:
        signals: names of the signals that stop the run.
    """

    register_at_setup = False

    def __init__(self, signals: tuple[str, ...] | list[str] = ("SIGTERM", "SIGINT")) -> None:
        unknown = [s for s in signals if not hasattr(signal, s)]
        if unknown:
            raise ValueError(f"signals={list(signals)}: {unknown} are not signals of this platform")
        self.signums = [getattr(signal, s) for s in signals]
        self.received: int | None = None
        self.stopped_by: int | None = None
        self.checkpoint: str | None = None
        self._previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int:
        """What the command should exit with after a stop (0: not stopped)."""
        return 0 if self.stopped_by is None else 128 + int(self.stopped_by)

    def _install(self) -> None:
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._handler)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self.register_at_setup:
            self._install()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.register_at_setup:
            self._install()

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.received = signum

    def _agreed(self, trainer: Trainer, pl_module: LightningModule) -> int | None:
        """The signal to act on, agreed by all ranks (one process: no device sync)."""
        if trainer.world_size == 1:
            return self.received
        flag = torch.tensor(float(self.received or 0), device=pl_module.device)
        agreed = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        return agreed or None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        signum = self._agreed(trainer, pl_module)
        if signum is None:
            return
        self.checkpoint = self.checkpoint_path(trainer)
        trainer.save_checkpoint(self.checkpoint)
        self.after_checkpoint(trainer, signum)
        self.received = None
        trainer.should_stop = True
        # A stop ends the epoch early, and Lightning would then validate (minutes at paper scale, past a
        # scheduler's grace period) and let ModelCheckpoint save the half epoch as a finished one. The
        # checkpoint above is this step's: skip both. After an epoch's last batch the epoch *is*
        # finished (a resume starts the next one): its validation and checkpoint run as usual.
        if not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            skip_next_validation(trainer)
            count_as_saved(trainer, self.checkpoint)

    def checkpoint_path(self, trainer: Trainer) -> str:
        """``interrupted.ckpt`` beside the run's other checkpoints."""
        callback = trainer.checkpoint_callback
        folder = (
            getattr(callback, "dirpath", None)
            or Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"
        )
        return str(Path(folder) / "interrupted.ckpt")

    def after_checkpoint(self, trainer: Trainer, signum: int) -> None:
        self.stopped_by = signum
        rank_zero_warn(
            f"stopped by {signal.Signals(signum).name} in epoch {trainer.current_epoch} after batch "
            f"{trainer.fit_loop.epoch_loop.batch_progress.current.processed}: saved {self.checkpoint}; "
            "resume with --ckpt_path last (or that file)"
        )

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()  # a failed run leaves Ctrl-C to the caller (a notebook, the demo) as it was


def _file_info(fs: Any, path: str) -> dict[str, Any] | None:
    """What the file system says about ``path`` (size, modification time, ...), or None if absent."""
    try:
        return dict(fs.info(path))
    except FileNotFoundError:
        return None


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Torch checkpoint IO that makes sure the file was written, retries, and then stops the run.

    Lightning's atomic save swallows a ``PermissionError``, so an unwritable checkpoint folder
    used to end a run with exit 0 and no checkpoint. Here each save is checked (the file exists and
    was written by this save); a failed save is retried, then raises a clear error naming the file.
    Reads go through `splitlab.checkpoint.read_checkpoint`: nothing in a checkpoint runs.

    Args:
        retries: further attempts after a failed save.
        wait: seconds between attempts (network file systems recover from short hiccups).
    """

    def __init__(self, retries: int = 2, wait: float = 1.0) -> None:
        super().__init__()
        self.retries, self.wait = retries, wait

    def load_checkpoint(
        self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read as every splitlab reader reads (`splitlab.checkpoint.read_checkpoint`: weights and plain
        settings only, whatever ``weights_only`` Lightning passes); a remote file (``s3://`` ...)
        through Lightning's reader, weights only too."""
        if "://" in str(path):
            with safe_checkpoint_globals():
                return super().load_checkpoint(path, map_location, weights_only=True)
        return read_checkpoint(path, "ckpt_path", map_location=map_location)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Write to ``<path>.partial``, then rename it to ``path``: a save that fails half-way (a full
        disk) leaves the previous checkpoint whole, never a truncated one under its name."""
        target = str(path)
        partial = f"{target}.partial"
        fs = get_filesystem(target)  # a local folder, or s3://, gs://, ... as Lightning writes them
        problem: BaseException | str = "nothing was written"
        for attempt in range(self.retries + 1):
            before = _file_info(fs, target)
            try:
                super().save_checkpoint(checkpoint, partial, storage_options)
                if _file_info(fs, partial) is not None:
                    fs.mv(partial, target)
            except OSError as err:
                problem = err
            else:
                # written by this save: there, not empty, and not the file that was there before (the
                # file system's own size/time/inode, never this machine's clock against a server's)
                after = _file_info(fs, target)
                if after is not None and after.get("size", 0) > 0 and after != before:
                    return
                problem = "nothing was written"
            _remove(fs, partial)
            if attempt < self.retries:
                time.sleep(self.wait)
        raise OSError(
            f"checkpoint {target} could not be written ({problem}); the run stops so that no work is lost "
            "silently: make the checkpoint folder writable (or point ModelCheckpoint's dirpath elsewhere) and "
            "resume from the last checkpoint"
        )


def _remove(fs: Any, path: str) -> None:
    """Delete a half-written file, if there is one (a full disk may refuse even that: then it stays)."""
    try:
        if fs.exists(path):
            fs.rm(path)
    except OSError:
        pass


class AgreedCheckpointSave:
    """``strategy.save_checkpoint`` that stops every rank alike when the write fails.

    Only rank 0 writes; the other ranks go on to the barrier after the write and, when rank 0 stops,
    would wait there until the process group times out (30 minutes under NCCL) or fail with a
    transport error that names nothing. Installed on the strategy, every rank takes part in one
    broadcast of rank 0's outcome after the write and raises the same clear error: one small
    collective per checkpoint, none per batch. A class (not a closure) so a spawned strategy pickles.
    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    @classmethod
    def install(cls, strategy: Any) -> None:
        if not isinstance(strategy.__dict__.get("save_checkpoint"), cls):
            strategy.save_checkpoint = cls(strategy)

    def __call__(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        error: Exception | None = None
        try:
            type(self.strategy).save_checkpoint(
                self.strategy, checkpoint, filepath, storage_options=storage_options
            )
        except Exception as err:  # any failure (a full disk, an unpicklable state) stops every rank alike
            error = err
        said = str(error) if isinstance(error, OSError) else f"{type(error).__name__}: {error}"
        problem = self.strategy.broadcast(None if error is None else said, src=0)
        if error is not None:
            raise error
        if problem is not None:
            raise OSError(f"rank 0 stopped: {problem}")


class SkippedSamples(Callback):
    """Report the samples the data module skipped (unreadable images, annotations that do not fit the
    settings), summed over every rank: at the end of each training epoch, and at the end of
    validate, test and predict runs. Skipping keeps a long run alive, the report keeps it honest."""

    def __init__(self) -> None:
        self.reported = False

    def _report(self, trainer: Trainer, pl_module: LightningModule, when: str) -> None:
        report = getattr(trainer.datamodule, "skipped_report", None)
        if not callable(report):
            return
        message = report(lambda t: trainer.strategy.reduce(t.to(pl_module.device), reduce_op="sum").cpu())
        if message:
            self.reported = True
            rank_zero_warn(f"{when}: {message}")

    def _end(self, trainer: Trainer, pl_module: LightningModule | None = None, when: str = "") -> None:
        """A run's end: its last report (``when``), then the hint if anything was skipped."""
        if when:
            self._report(trainer, pl_module, when)
        if self.reported:
            rank_zero_info("splitlab: set data.init_args.strict=true to stop at the first bad sample instead")
            self.reported = False

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer, pl_module, f"epoch {trainer.current_epoch}")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end(trainer)  # the last epoch's report was made at its end

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "validate":  # in a fit, the epoch's report covers its validation
            self._end(trainer, pl_module, "validate")

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end(trainer, pl_module, "test")

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end(trainer, pl_module, "predict")
