"""A policy another run trained, deployed in this one (``policy: transferred``), and the checks of
which policy a task trains: the settings each policy reads, and what a transfer needs of its source."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from torch import Tensor

from splitlab.model import SplitModel
from splitlab.model.base import TRAINED_POLICIES
from splitlab.tasks.settings import TokenizerSettings

# the decision module's settings a transfer must match (the levels are compared as the model has them)
DECISION_SETTINGS = tuple(f.name for f in fields(TokenizerSettings) if f.name != "levels")


def check_policy(
    policy: str, budget_range: Sequence[float] | None, policy_checkpoint: str | None, transfer_finetune: bool
) -> None:
    """Refuse a policy a task cannot train, settings it would ignore, or a transfer without its source."""
    if policy not in TRAINED_POLICIES:
        raise ValueError(f"policy={policy!r}: expected one of {TRAINED_POLICIES}")
    if policy != "learned" and budget_range is not None:
        raise ValueError(
            f"budget_range={list(budget_range)} needs policy='learned' (a {policy} policy serves one budget)"
        )
    if policy == "transferred" and not policy_checkpoint:
        raise ValueError(
            "policy='transferred' deploys another run's policy: set policy_options.policy_checkpoint to that run's "
            "folder, .ckpt or save_pretrained folder"
        )
    if policy != "transferred" and policy_checkpoint:
        raise ValueError(
            f"policy_options.policy_checkpoint={policy_checkpoint!r} is read by policy: transferred only, and "
            f"this run trains policy={policy!r}: set policy: transferred, or remove policy_checkpoint"
        )
    if policy != "transferred" and transfer_finetune:
        raise ValueError(
            "policy_options.transfer_finetune=true fine-tunes a transferred policy, and this run trains "
            f"policy={policy!r}: set policy: transferred (with policy_checkpoint), or remove transfer_finetune"
        )


def transferred_decision(path: str, model: SplitModel) -> dict[str, Tensor]:
    """The decision module's weights of the run at ``path``, for ``model`` to deploy.

    Only those weights: the operating points are not taken, since this run's warm start and
    calibration fit the cut on its own images, where the source's cut would buy another token
    fraction. The tokens the policy reads come from this run's backbone and embeddings, so transfer
    assumes both runs started from the same pretrained backbone; backbone, levels, image size and
    the decision module's settings must match, and a mismatch is refused naming both values.
    """
    from splitlab.model.load import load  # the one reader of run folders, .ckpt and save_pretrained

    source = load(path, setting="policy_checkpoint")
    where = f"policy_checkpoint={path!r}"
    if source.policy != "learned":
        raise ValueError(
            f"{where} deploys policy {source.policy!r}, not a learned one: it has no trained decision "
            "module to transfer (give a run that trained policy: learned or transferred)"
        )
    ours, theirs = model.config, source.config
    pairs = [
        ("backbone", ours["backbone"], theirs["backbone"]),
        ("levels", list(model.levels.sizes), list(source.levels.sizes)),
        ("image size", list(model.backbone.img_size), list(source.backbone.img_size)),
        *((k, ours[k], theirs[k]) for k in DECISION_SETTINGS),
    ]
    for name, mine, its in pairs:
        if mine != its:
            raise ValueError(
                f"{where} was trained with {name} {its!r} and this run has {mine!r}: transfer needs the "
                "same backbone, levels, image size and decision module"
            )
    if source.tokenizer.budget_conditioned:
        lo, hi = source.tokenizer.operating_points.range
        raise ValueError(
            f"{where} holds a budget-conditioned policy (budget_range [{lo:g}, {hi:g}]); a transferred "
            "policy serves one budget: transfer a single-budget run"
        )
    return source.tokenizer.decision.state_dict()
