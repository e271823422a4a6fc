"""Old names of the task API, honoured with a warning for one release (`splitlab.deprecation`): a task
written against them keeps working, and says what to rename."""

from __future__ import annotations

from splitlab.deprecation import warn_renamed

RENAMED = {"per_sample_loss": "per_image_loss", "split_batch": "unpack_batch"}


def adopt_renamed(cls: type) -> None:
    """Give ``cls`` the new name of each old-named method it defines (and not the new one), warning once."""
    for old, new in RENAMED.items():
        if old in vars(cls) and new not in vars(cls):
            warn_renamed(f"{cls.__qualname__}.{old}", new, stacklevel=3)  # at the class statement
            setattr(cls, new, vars(cls)[old])
