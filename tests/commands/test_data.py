"""`splitlab data shapes`: the generator's command line writes the ImageFolder layout."""

from __future__ import annotations

import json
from pathlib import Path


def test_shapes_generator_cli(tmp_path) -> None:
    from splitlab.commands import run

    assert (
        run(["data", "shapes", "--out", str(tmp_path / "s"), "--train", "1", "--val", "1", "--test", "1"])
        == 0
    )
    files = sorted(Path(tmp_path / "s").rglob("*.png"))
    assert len(files) == 12
    meta = json.loads((tmp_path / "s" / "splitlab_dataset.json").read_text())
    assert meta["classes"] == ["hstripes", "vstripes", "checks", "dots"]
