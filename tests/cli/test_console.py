"""A quiet, honest console: the third-party messages checked to be harmless are silenced in one
place, every other warning still shows, and the tiny twin's fit prints no Python warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

from splitlab.cli.console import HARMLESS_WARNINGS, quiet_console
from tests.helpers import REPO, schedule_args, tiny_args


def test_the_harmless_are_silenced_and_the_rest_still_shows(caplog) -> None:
    import lightning_utilities.core.rank_zero as rank_zero

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_console()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("Fail to import ``MultiScaleDeformableAttention`` from mmcv", UserWarning, stacklevel=1)
        warnings.warn("something that matters", UserWarning, stacklevel=1)
        warnings.warn(
            "`isinstance(treespec, LeafSpec)` is deprecated", UserWarning, stacklevel=1
        )  # not its category
    assert [str(w.message) for w in caught] == [
        "something that matters",
        "`isinstance(treespec, LeafSpec)` is deprecated",
    ]
    assert all(why for _, _, why in HARMLESS_WARNINGS)
    with caplog.at_level(logging.INFO):
        rank_zero.log.info("💡 Tip: try installing litlogger")
        rank_zero.log.info("GPU available: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False"]


def test_a_fit_of_the_tiny_twin_prints_no_python_warning(shapes_root, tmp_path) -> None:
    args = tiny_args(shapes_root, tmp_path, *schedule_args(1, 1))
    # the user's own filters: Python's defaults (which hide DeprecationWarnings outside __main__)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "splitlab", "fit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout + done.stderr
    lines = [
        line for line in said.splitlines() if "Warning" in line or "warnings.warn" in line or "💡" in line
    ]
    assert not lines, "\n".join(lines)
