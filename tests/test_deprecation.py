"""Old names warn where a user sees it: a task and a data module written for them, in the user's own
module (not ``__main__``, where Python would show even a DeprecationWarning), under Python's default
warning filters, each warning naming the new name and the one release that drops the old."""

from __future__ import annotations

import os
import subprocess
import sys

from splitlab.deprecation import REMOVED_IN
from tests.helpers import REPO

OLD_TASK = """
from splitlab.data.common import SplitDataModule
from splitlab.tasks import ClassificationTask


class OldTask(ClassificationTask):
    def per_sample_loss(self, outputs, targets):
        return outputs.sum(-1)

    def split_batch(self, batch):
        return batch
"""


def test_an_old_name_warns_under_the_default_filters(tmp_path) -> None:
    (tmp_path / "mytask.py").write_text(OLD_TASK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's own defaults
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    done = subprocess.run(
        [sys.executable, "-c", "import mytask"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "FutureWarning" in line]
    removed = f"rename it (the old name is removed in splitlab {REMOVED_IN})"
    for old, new in (
        ("splitlab.data.common.SplitDataModule", "BaseDataModule"),
        ("OldTask.per_sample_loss", "per_image_loss"),
        ("OldTask.split_batch", "unpack_batch"),
    ):
        # shown, at the user's line, with the new name and the release
        assert any(
            "mytask.py:" in line and line.endswith(f"FutureWarning: {old} is now {new}: {removed}")
            for line in said
        ), done.stderr
