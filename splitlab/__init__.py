"""splitlab: SPLIT (Split Policy Learned Image Tokenization) for timm vision transformers on Lightning.

``splitlab.load(path)`` returns a trained `SplitModel` (a plain torch module) from a run folder, a
checkpoint, a ``save_pretrained`` folder or a Hub id; it is imported on first use, so ``import
splitlab`` stays light. The map of the package (rooms, data flow, import rules): docs/architecture.md.
"""

from typing import Any

from splitlab.version import __version__

__all__ = ["SplitModel", "__version__", "load"]


def __getattr__(name: str) -> Any:
    if name in ("load", "SplitModel"):
        import splitlab.model

        return getattr(splitlab.model, name)
    raise AttributeError(f"module 'splitlab' has no attribute {name!r}")
