"""A run folder's lock that names nobody: empty or garbled (its writer died between creating and
writing it) is taken over with a warning once it has stayed so; a live writer mid-write is waited for;
one that cannot be read is refused, naming the file."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from splitlab.cli import runs
from splitlab.cli.runs import LOCK, RunLock


@pytest.mark.parametrize("left", ["", '{"pid": 12', "[]", "{}"], ids=["empty", "cut", "list", "no-pid"])
def test_a_lock_that_names_nobody_is_taken_over_with_a_warning(tmp_path, left) -> None:
    (tmp_path / LOCK).write_text(left)
    old = time.time() - 60
    os.utime(tmp_path / LOCK, (old, old))
    lock = RunLock(tmp_path)
    with pytest.warns(UserWarning, match=f"{tmp_path / LOCK}: a lock that names no process .*taking it over"):
        lock.acquire()
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK).exists()


def test_a_writer_filling_in_its_lock_is_waited_for(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runs, "EMPTY_LOCK_GRACE", 5.0)
    path = tmp_path / LOCK
    path.write_text("")  # just created by another run, which writes its holder a moment later
    other = {**RunLock(tmp_path).owner(), "pid": os.getpid(), "job": None, "host": "another-host"}
    writer = threading.Timer(0.3, lambda: path.write_text(json.dumps(other)))
    writer.start()
    try:
        with pytest.raises(RuntimeError, match="another run is writing there .* on another-host"):
            RunLock(tmp_path).acquire()
    finally:
        writer.join()
    assert json.loads(path.read_text()) == other  # left alone


def test_an_unreadable_lock_is_refused_naming_it(tmp_path, monkeypatch) -> None:
    (tmp_path / LOCK).write_text("")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(tmp_path), "read_text", denied)
    with pytest.raises(RuntimeError) as refused:
        RunLock(tmp_path).acquire()
    assert str(refused.value) == (
        f"{tmp_path / LOCK}: the run folder's lock cannot be read (Permission denied); if no run is writing "
        "into that folder, delete the file"
    )
