"""SPLIT tokenizer: multi-scale patch embedding, split decisions, quadtree walk, `TokenLayout`.

One API for training, evaluation, bench and predict: ``SplitTokenizer.embed`` ->
``decide`` (``sample | threshold | labels | scores``) -> `build_layout`, or all three as
``SplitTokenizer(images, backbone, mode=...)``. `splitlab.tokenizer.policy` holds the Bernoulli
distribution of the decisions; `splitlab.tokenizer.labels` the warm-start labels.

Plain PyTorch (and timm layers): usable from any training loop.
"""

from splitlab.tokenizer.baselines import (
    BASELINES,
    baseline_scores,
    calibrate_threshold,
    entropy_scores,
    expected_random_fraction,
    level_quantiles,
    level_thresholds,
    patch_entropy,
    random_split_rate,
)
from splitlab.tokenizer.decision import (
    DECISION_CONTEXTS,
    DECISION_DIM,
    DECISION_FEATURES,
    DECISION_HEADS,
    SplitDecision,
)
from splitlab.tokenizer.embed import EmbeddingSource, MultiScalePatchEmbed
from splitlab.tokenizer.labels import (
    LabelEmbedding,
    annotation_labels,
    annotation_scores,
    cut_labels,
    embedding_difference_scores,
    gain_labels,
    tree_scores,
    warm_start_labels,
)
from splitlab.tokenizer.layout import TokenLayout
from splitlab.tokenizer.levels import Levels
from splitlab.tokenizer.operating_points import OperatingPoints, budget_points
from splitlab.tokenizer.quadtree import (
    build_layout,
    cap_fraction,
    cap_splits,
    count_tokens,
    cover_slots,
    fraction_of,
    leaf_masks,
)
from splitlab.tokenizer.tokenizer import MODES, SplitTokenizer

__all__ = [
    "DECISION_CONTEXTS",
    "DECISION_DIM",
    "DECISION_FEATURES",
    "DECISION_HEADS",
    "BASELINES",
    "MODES",
    "EmbeddingSource",
    "LabelEmbedding",
    "Levels",
    "MultiScalePatchEmbed",
    "OperatingPoints",
    "SplitDecision",
    "SplitTokenizer",
    "TokenLayout",
    "annotation_labels",
    "annotation_scores",
    "baseline_scores",
    "budget_points",
    "build_layout",
    "calibrate_threshold",
    "cap_fraction",
    "cap_splits",
    "count_tokens",
    "cover_slots",
    "cut_labels",
    "embedding_difference_scores",
    "entropy_scores",
    "expected_random_fraction",
    "fraction_of",
    "gain_labels",
    "leaf_masks",
    "level_quantiles",
    "level_thresholds",
    "patch_entropy",
    "random_split_rate",
    "tree_scores",
    "warm_start_labels",
]
