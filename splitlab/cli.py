"""The LightningCLI behind ``lightning fit --config tasks/coco.yaml`` (and ``splitlab fit ...``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from lightning import LightningDataModule, Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from splitlab.callbacks import LayoutWriter, ResumePosition, SplitSchedule
from splitlab.tasks import SplitTask

DEFAULT_CALLBACKS = (SplitSchedule, ResumePosition, LayoutWriter)


class SplitLabCLI(LightningCLI):
    """LightningCLI over any `SplitTask` and DataModule, adding the callbacks every run needs.

    A recipe that names no `SplitSchedule` gets the default one (1 warm-start epoch, then PPO);
    `ResumePosition` (exact mid-epoch resume) and `LayoutWriter` (``predict`` writes layouts) are
    added unless the recipe configures its own.
    """

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


def main(argv: Sequence[str] | None = None) -> None:
    """``lightning {fit,validate,test,predict} ...``."""
    lightning_main(None if argv is None or list(argv) == sys.argv[1:] else list(argv))


if __name__ == "__main__":
    main()
