"""One run, one folder: where a command's logger writes, whether another run is already there, and a
lock that keeps two runs from writing into one folder at once.

The recipes' loggers name a fixed folder (``runs/<task>/split``, the CI twins' ``runs/ci/<task>/split``),
so a second fit, a validate or a predict with the same settings would write into the first fit's
folder: Lightning's CSV writer deletes its ``metrics.csv``, ``config.yaml`` is replaced, checkpoints
pile up as ``last-v1.ckpt`` beside the old ones. Here a fresh fit into a folder that holds a run is
refused (resume it, or name another version), evaluation commands write into a subfolder of their
own, and a lock file says who is writing.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

LOCK = ".splitlab.lock"
# what a fit leaves in its folder: another run lives there when any of these is present
RUN_FILES = ("metrics.csv", "hparams.yaml", "summary.json")
CHOSEN = "SPLITLAB_EVALUATION_VERSION"  # rank 0's choice, for the ranks Lightning's launcher starts after it
# seconds a lock may name no process while its writer fills it in (it writes its holder right after
# creating it): one still so after this was left by a writer that died in between
EMPTY_LOCK_GRACE = 2.0


def version_folder(version: int | str) -> str:
    """The folder name a logger version writes into, as Lightning's CSV and TensorBoard loggers name it."""
    return version if isinstance(version, str) else f"version_{version}"


def first_free(folder: Path, name: str) -> str:
    """``name``, or ``name-1``, ``name-2``, ... : the first that is not yet in ``folder``."""
    count = 0
    while (folder / (name if count == 0 else f"{name}-{count}")).exists():
        count += 1
    return name if count == 0 else f"{name}-{count}"


def logger_folder(trainer_config: Any) -> Path | None:
    """The folder a command's logger writes into, when its settings fix one (``save_dir``, ``name``
    and a ``version``); None when Lightning picks a new ``version_N`` each run, or there is no logger."""
    named = getattr(trainer_config.get("logger"), "init_args", None)
    if named is None or named.get("save_dir") is None or named.get("version") is None:
        return None
    return Path(named.save_dir) / (named.get("name") or "") / version_folder(named.version)


def run_files(folder: Path) -> list[str]:
    """What of a finished or running run ``folder`` holds (empty: nobody's run is there)."""
    found = [name for name in RUN_FILES if (folder / name).is_file()]
    found += [f"checkpoints/{p.name}" for p in sorted((folder / "checkpoints").glob("*.ckpt"))[:2]]
    return found


def evaluation_folder(trainer_config: Any, subcommand: str) -> Path | None:
    """``validate``, ``test`` and ``predict`` write into ``<run>/<subcommand>/`` (``-1``, ``-2``, ... when
    that exists too) when the logger's folder holds files: nothing of the run there is touched. The
    logger's version is changed to match; the folder chosen is returned (None: left as it was)."""
    run = logger_folder(trainer_config)
    named = getattr(trainer_config.get("logger"), "init_args", None)
    if run is None or named is None:
        return None
    if rank_from_environment() != 0 and os.environ.get(CHOSEN):  # the folder rank 0 chose
        named.version = os.environ[CHOSEN]
        return logger_folder(trainer_config)
    if not run.is_dir() or not any(run.iterdir()):  # a new or empty folder is this command's own
        return None
    folder = first_free(run, subcommand)
    version = version_folder(named.version)
    named.version = str(Path(version) / folder) if version else folder
    os.environ[CHOSEN] = named.version
    return run / folder


def refuse_taken(run: Path) -> None:
    """Refuse a fresh fit into a folder that holds another run, naming the ways out."""
    taken = run_files(run)
    if not taken:
        return
    resume = " resume it with --ckpt_path last," if any(t.startswith("checkpoints/") for t in taken) else ""
    raise FileExistsError(
        f"{run} already holds a run ({', '.join(taken)}):{resume} start a new one with "
        "--trainer.logger.init_args.version=<a new name> (or another save_dir), or delete that folder"
    )


def rank_from_environment() -> int:
    """This process's global rank as the launchers set it (Lightning's, torchrun, SLURM), before any
    process group exists; 0 for a single process."""
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


class RunLock:
    """``<run>/.splitlab.lock``: the process writing into a run folder (pid, host, SLURM job).

    Taken by rank 0 when a fit starts, released when it ends. A lock left by a process that no
    longer runs on this host (a crash, kill -9), or by an earlier try of the same SLURM job (a
    requeue), is taken over; a live one refuses the second run before it trains.

    An empty or garbled lock (no holder to ask) is taken over too, with a warning, once it has
    stayed so for `EMPTY_LOCK_GRACE` seconds: its writer creates it and writes its holder at once,
    so only one that died in between (killed, a full disk) leaves it so, and refusing would block
    the folder for good over a file that names nobody. One that cannot be read at all (permissions)
    may be a live run's: refused, naming the file.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self.held = False

    def owner(self) -> dict[str, Any]:
        """Who this process is, as the lock records it."""
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "job": os.environ.get("SLURM_JOB_ID"),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }

    def stale(self, holder: dict[str, Any]) -> bool:
        """Whether the recorded holder is gone: this very process, a dead pid on this host, or an
        earlier try of this SLURM job."""
        me = self.owner()
        if holder.get("job") and holder.get("job") == me["job"]:
            return True
        if holder.get("host") != me["host"]:
            return False  # another machine's process: cannot be checked from here
        pid = int(holder.get("pid", -1))
        if pid == me["pid"]:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def holder(self) -> dict[str, Any] | None:
        """Who the lock names, or None when it names no process (empty, or not a JSON object with a
        pid) and has stayed so past `EMPTY_LOCK_GRACE` (a writer that died while writing it; a live
        one, mid-write, is waited for). FileNotFoundError: released meanwhile; a lock that cannot be
        read is a one-line error naming it."""
        while True:
            try:
                text = self.path.read_text()
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                raise
            except OSError as err:
                raise RuntimeError(
                    f"{self.path}: the run folder's lock cannot be read ({err.strerror or err}); if no run is "
                    "writing into that folder, delete the file"
                ) from None
            try:
                holder = json.loads(text)
            except ValueError:
                holder = None
            if isinstance(holder, dict) and "pid" in holder:
                return holder
            if age >= EMPTY_LOCK_GRACE:
                return None
            time.sleep(min(0.1, EMPTY_LOCK_GRACE - age))

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                with os.fdopen(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY), "w") as f:
                    json.dump(self.owner(), f)
                self.held = True
                return
            except FileExistsError:
                try:
                    holder = self.holder()
                except FileNotFoundError:  # its run ended meanwhile
                    continue
                if holder is None:
                    warnings.warn(
                        f"{self.path}: a lock that names no process (empty or garbled: left by a run that died "
                        "while taking it); taking it over",
                        stacklevel=2,
                    )
                    self.path.unlink(missing_ok=True)
                    continue
                if not self.stale(holder):
                    raise RuntimeError(
                        f"{self.path.parent}: another run is writing there (pid {holder.get('pid')} on "
                        f"{holder.get('host')} since {holder.get('since')}); wait for it, or give this run another "
                        f"--trainer.logger.init_args.version (if that run is gone, delete {self.path})"
                    ) from None
                self.path.unlink(missing_ok=True)
        raise RuntimeError(f"{self.path}: could not take the run folder's lock")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


HELD: list[RunLock] = []


def lock_run(folder: Path) -> None:
    """Take ``folder``'s lock for this process (rank 0 only; the others write nothing there)."""
    if rank_from_environment() != 0:
        return
    lock = RunLock(folder)
    lock.acquire()
    HELD.append(lock)


def release_runs() -> None:
    """Release every run lock this process holds (when a command ends, however it ends)."""
    while HELD:
        HELD.pop().release()
