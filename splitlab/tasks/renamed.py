"""Old names of the task API, honoured with a warning for one release: a task written against them
keeps working, and says what to rename."""

from __future__ import annotations

import warnings

RENAMED = {"per_sample_loss": "per_image_loss", "split_batch": "unpack_batch"}


def adopt_renamed(cls: type) -> None:
    """Give ``cls`` the new name of each old-named method it defines (and not the new one), warning once."""
    for old, new in RENAMED.items():
        if old in vars(cls) and new not in vars(cls):
            warnings.warn(
                f"{cls.__qualname__}.{old} is now {new}: rename it (the old name goes in the next release)",
                DeprecationWarning,
                stacklevel=3,
            )
            setattr(cls, new, vars(cls)[old])
