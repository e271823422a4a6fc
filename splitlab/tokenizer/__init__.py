"""SPLIT tokenizer: multi-scale patch embedding, split decisions, quadtree walk, `TokenLayout`.

Plain PyTorch (and timm layers): usable from any training loop.
"""

from splitlab.tokenizer.baselines import (
    BASELINES,
    baseline_scores,
    calibrate_threshold,
    entropy_scores,
    expected_random_fraction,
    patch_entropy,
    random_split_rate,
)
from splitlab.tokenizer.decision import SplitDecision
from splitlab.tokenizer.embed import EmbeddingSource, MultiScalePatchEmbed
from splitlab.tokenizer.layout import TokenLayout
from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.quadtree import build_layout, count_tokens, fraction_of, leaf_masks
from splitlab.tokenizer.tokenizer import MODES, SplitTokenizer

__all__ = [
    "BASELINES",
    "MODES",
    "EmbeddingSource",
    "Levels",
    "MultiScalePatchEmbed",
    "SplitDecision",
    "SplitTokenizer",
    "TokenLayout",
    "baseline_scores",
    "build_layout",
    "calibrate_threshold",
    "count_tokens",
    "entropy_scores",
    "expected_random_fraction",
    "fraction_of",
    "leaf_masks",
    "patch_entropy",
    "random_split_rate",
]
