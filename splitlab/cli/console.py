"""A quiet, honest console: what splitlab's commands print is something a user can act on.

Each filter here silences one third-party message checked to be harmless for splitlab (Lightning
2.6, torch 2.14, mmcv-lite 2.x), in this one place, saying why; every other warning still shows.
"""

from __future__ import annotations

import logging
import warnings

# (message pattern, category, why it is silenced)
HARMLESS_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        "Lightning's own pytree helper (lightning/pytorch/utilities/_pytree.py) builds torch's "
        "LeafSpec, which torch 2.14 deprecates: nothing in the user's code or settings",
    ),
    (
        r"Fail to import ``MultiScaleDeformableAttention``",
        UserWarning,
        "mmcv-lite has no compiled ops; splitlab's mmseg decode heads use no deformable attention",
    ),
)
# Lightning's advertisements (litlogger, litmodels): an install hint on every run, no warning
ADVERTISEMENT = "💡 Tip:"


class _NoAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ADVERTISEMENT)


def quiet_console() -> None:
    """Install the filters (idempotent): the harmless warnings above and Lightning's tips."""
    for pattern, category, _why in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    import lightning_utilities.core.rank_zero as rank_zero  # the logger Lightning's rank_zero_info writes to

    for logger in {
        rank_zero.log,
        logging.getLogger("lightning.pytorch"),
        logging.getLogger("lightning.fabric"),
    }:
        if not any(isinstance(f, _NoAdvertisements) for f in logger.filters):
            logger.addFilter(_NoAdvertisements())
