"""`VerifiedCheckpointIO`: a save is checked on the file system it went to, local or remote."""

from __future__ import annotations

import fsspec
import pytest

from splitlab.callbacks import VerifiedCheckpointIO


def test_a_save_to_a_remote_file_system_is_verified_there(monkeypatch) -> None:
    """``memory://`` stands in for s3:// or gs://: the check asks that file system, not the local disk
    (where the path does not exist, so every save used to fail)."""
    io = VerifiedCheckpointIO(retries=0)
    io.save_checkpoint({"step": 1}, "memory://run/checkpoints/last.ckpt")
    fs = fsspec.filesystem("memory")
    assert fs.info("memory://run/checkpoints/last.ckpt")["size"] > 0
    io.save_checkpoint({"step": 2}, "memory://run/checkpoints/last.ckpt")  # overwriting is a write too

    import lightning.fabric.plugins.io.torch_io as torch_io

    monkeypatch.setattr(torch_io, "_atomic_save", lambda checkpoint, path: None)  # the write is lost
    with pytest.raises(OSError, match=r"checkpoint memory://run/checkpoints/last.ckpt could not be written"):
        io.save_checkpoint({"step": 3}, "memory://run/checkpoints/last.ckpt")  # the old file is no proof
