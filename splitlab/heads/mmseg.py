"""The mmsegmentation adapter: its decode heads built from registry dicts, on top of ``mmcv-lite``.

mmsegmentation 1.2.2 needs mmcv 2.1 (2.2 fails its version assertion). The full mmcv wheel is
not on PyPI for current torch, and building it with CPU ops takes ~13 minutes and a C++20
patch, so splitlab depends on the pure-Python ``mmcv-lite``. A handful of mmseg modules import
``mmcv.ops`` at top level (``point_sample``, ``sigmoid_focal_loss``) although the decode heads
splitlab uses (UPerHead, FCNHead, and every head without compiled ops) never call them. When
the compiled ops are missing, this module installs an ``mmcv.ops`` stand-in: the pure-Python
``point_sample`` is loaded from mmcv's own source, and every other op raises a clear error when
used. A full mmcv install is used as is.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any


def _missing_op(name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"mmcv.ops.{name} needs mmcv's compiled ops, which mmcv-lite lacks: install a full mmcv 2.1 build "
            "or choose a decode head without compiled ops (UPerHead, FCNHead, ASPPHead, SegformerHead, ...)"
        )

    return unavailable


def _install_ops_stand_in() -> None:
    import mmcv

    ops = types.ModuleType("mmcv.ops")
    ops.__file__ = __file__
    ops.__path__ = []
    source = Path(mmcv.__file__).parent / "ops" / "point_sample.py"
    spec = importlib.util.spec_from_file_location("mmcv.ops.point_sample", source)
    if spec is not None and spec.loader is not None:
        point_sample = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(point_sample)
        sys.modules["mmcv.ops.point_sample"] = point_sample
        ops.point_sample = point_sample.point_sample

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing_op(name)

    ops.__getattr__ = __getattr__
    sys.modules["mmcv.ops"] = ops
    mmcv.ops = ops


def import_mmseg() -> Any:
    """``mmseg``'s model registry, with its decode heads registered."""
    try:
        import mmcv  # noqa: F401
    except ImportError as err:
        raise ImportError("segmentation needs mmsegmentation: pip install 'splitlab[seg]'") from err
    if "mmcv.ops" not in sys.modules:
        try:
            import mmcv.ops  # noqa: F401
        except ImportError:
            _install_ops_stand_in()
    import mmseg.models  # noqa: F401  (registers the heads)
    from mmseg.registry import MODELS

    return MODELS


def build_mmseg_head(config: dict[str, Any], setting: str = "decode_head") -> Any:
    """An mmseg decode head (``nn.Module``) from its registry dict, e.g. ``{"type": "UPerHead", ...}``;
    a config mmseg cannot build is refused naming ``setting``, the config and mmseg's reason."""
    models = import_mmseg()
    try:
        return models.build(config)
    except (TypeError, KeyError, AssertionError, ValueError) as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ValueError(f"{setting}: mmseg cannot build a {config.get('type')} from it: {reason}") from err
