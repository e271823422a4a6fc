"""``splitlab demo --heldout N``: a finished demo run scored again on N more images of its generator.

The twins validate on 80 to 150 images per class (classification) or 80 scenes (COCO, ADE20K):
enough to rank policies some points apart, not to tell a learned policy 0.01 under the oracle from
one 0.03 under. On the hard classification twin a learned - oracle difference moved by 0.015 on
average (at most 0.056) between its 480 images and 4800 held-out ones (docs/loss_labels.md).

The held-out set comes from the same generator and settings under a seed no twin trains on (100 +
the seed the run's data was made with), so the runs that ``--reuse`` one demo's data score on the
same images; each run makes its own copy (``<out>/heldout-data``: no demo writes into another's
folder). The run's own checkpoint and operating point are scored, every row of its evaluation with
them, into ``<out>/heldout``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from splitlab.report import write_summary

# the twins whose generator makes a validation split of any size
HELDOUT_TASKS = ("classification", "coco", "ade20k")
HELDOUT_SEED = 100  # plus the data's seed: the docs' held-out sets (seed 0 -> 100, 1 -> 101, 2 -> 102)


def check_heldout(task: str, count: int) -> None:
    """Refuse ``--heldout`` for a twin whose data has no held-out split to grow, before anything runs."""
    if count and task not in HELDOUT_TASKS:
        raise ValueError(
            f"--heldout {count}: --task {task} has no held-out set (only {', '.join(HELDOUT_TASKS)})"
        )


DATA, SCORES = "heldout-data", "heldout"  # under the demo's --out: the images, the validation's files


def validate_args(out: Path, data: Path) -> list[str]:
    """``lightning validate`` of the run in ``out`` on ``data``: its saved config, its last checkpoint,
    its logger writing into ``out/heldout`` (never over the run's own files)."""
    for needed in (out / "config.yaml", out / "checkpoints" / "last.ckpt"):
        if not needed.is_file():
            raise FileNotFoundError(f"--heldout: {needed} not found (the SPLIT stage did not finish)")
    return [
        "validate",
        "--config",
        str(out / "config.yaml"),
        f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}",
        f"--data.init_args.root={data}",
        f"--trainer.logger.init_args.version={SCORES}",
    ]


def read_record(out: Path, data: Path) -> dict[str, Any]:
    """The held-out validation's summary, its stage named by the set it scored (also in its file, with
    the set's settings under ``heldout``, so that `splitlab compare` shows which rows these are)."""
    path = out / SCORES / "summary.json"
    record = json.loads(path.read_text())
    made = json.loads((data / ".complete").read_text())
    per = "per class" if made["task"] == "classification" else "scenes"
    record.update(stage=f"held-out, {made['count']} {per}", heldout=made)
    write_summary(record, path.parent)
    return record
