"""Old names kept working for one release, with a warning a user sees.

`FutureWarning`, not `DeprecationWarning`: Python hides the latter outside ``__main__``, so a task
or data module written against an old name (in the user's own module, run by the CLI) would never
hear of it; pandas and scikit-learn warn their users the same way.
"""

from __future__ import annotations

import warnings

REMOVED_IN = "0.3"  # the release that drops the old names (renamed during 0.1; 0.2 still warns)


def warn_renamed(old: str, new: str, stacklevel: int = 2) -> None:
    """Say that ``old`` is now ``new`` and when the old name goes (``stacklevel``: as `warnings.warn`'s,
    counted from the caller of this function)."""
    warnings.warn(
        f"{old} is now {new}: rename it (the old name is removed in splitlab {REMOVED_IN})",
        FutureWarning,
        stacklevel=stacklevel + 1,
    )
