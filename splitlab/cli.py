"""The one command-line entry point: ``splitlab`` and ``lightning`` (LightningCLI) plus tools.

``lightning fit --config tasks/coco.yaml`` and ``splitlab fit ...`` are the same LightningCLI;
``splitlab data ...``, ``splitlab bench ...`` and ``splitlab demo`` are splitlab's own tools.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning import LightningDataModule
from lightning.pytorch.cli import LightningCLI

from splitlab.tasks import SplitTask


class SplitLabCLI(LightningCLI):
    """LightningCLI over any `SplitTask` and any LightningDataModule (``class_path`` in the YAML)."""


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
    """``splitlab {fit,validate,test,predict,data,bench,demo} ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("data", "bench", "demo"):
        from splitlab import tools

        sys.exit(tools.run(argv))
    lightning_main(None if argv == sys.argv[1:] else argv)


if __name__ == "__main__":
    main()
