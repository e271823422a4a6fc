"""Settings and options renamed before 0.1 (the CHANGELOG's "Renamed" table), kept in one place so
that an old name is refused with its new one: an error that says what to write, never a shim that
accepts the old name."""

from __future__ import annotations

import re
from collections.abc import Sequence

# a task setting's old name -> its new one (both under model.init_args)
SETTINGS: dict[str, str] = {
    "target_fraction": "budget",
    "budgets": "budget_range",
    "budget_step": "budget_range ([lowest, highest, step])",
    "levels": "tokenizer.levels",
    "decision_dim": "tokenizer.decision_dim",
    "decision_heads": "tokenizer.decision_heads",
    "decision_context": "tokenizer.decision_context",
    "eval_budgets": "evaluation.eval_budgets",
    "eval_baselines": "evaluation.eval_baselines",
    "calibration_images": "evaluation.calibration_images",
    "lr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "warmup_steps": "optim.warmup_steps",
    "policy_lr": "optim.policy_lr",
    "grad_clip": "optim.grad_clip",
    "imitation_lr": "warm_start.imitation_lr",
    "imitation_weight": "warm_start.imitation_weight",
    "imitation_steps": "warm_start.imitation_steps",
    "teacher_forcing": "warm_start.teacher_forcing",
    "label_target": "warm_start.label_target",
    "label_source": "warm_start.label_source",
    "warm_start_finetune": "warm_start.finetune",
    "lambda_lr": "controller.lr",
    "lambda_gain": "controller.gain",
    "lambda_damping": "controller.damping",
    "lambda_init": "controller.init",
    "policy_checkpoint": "policy_options.policy_checkpoint",
    "transfer_finetune": "policy_options.transfer_finetune",
    "entropy_thresholds": "policy_options.entropy_thresholds",
    "apt_search": "policy_options.apt_search",
    "sampling_seed": "policy_options.sampling_seed",
    "checkpoint_path": "backbone_kwargs.checkpoint_path",
    "attn_backend": "backbone_kwargs.attn_backend",
    "anchor_sizes": "detector.anchor_sizes",
    "aspect_ratios": "detector.aspect_ratios",
    "representation_size": "detector.representation_size",
    "detector_kwargs": "detector.torchvision_kwargs",
    "tokenizer_file": "lm_tokenizer_file",
}
# a tool's old option -> its new one
OPTIONS: dict[str, str] = {
    "--image-size": "--img-size",
    "--fraction": "--budget",
    "--fractions": "--eval-budgets",
    "--budgets": "--eval-budgets",
}

NOT_ACCEPTED = re.compile(r"Option '([\w.]+)' is not accepted")
UNRECOGNIZED = re.compile(r"unrecognized arguments: (.+)$")
NULL_GIVEN = re.compile(r'Parser key "(\w+\.\w+)"')


def renamed_option(words: Sequence[str]) -> str | None:
    """One line for a tool's command line that uses an old option name, or None."""
    for word in words:
        old = word.split("=", 1)[0]
        if old in OPTIONS:
            return f"{old} was renamed {OPTIONS[old]} (CHANGELOG.md, 'Renamed'): write {OPTIONS[old]}"
    return None


def renamed_setting(key: str) -> str | None:
    """The hint for a task setting ``key`` (any prefix) whose name changed, or None."""
    parts = key.lstrip("-").split(".")
    name = parts[-1]
    if name not in SETTINGS or (len(parts) > 1 and parts[-2] != "init_args"):  # a group's own field
        return None
    return (
        f"model.init_args.{name} was renamed model.init_args.{SETTINGS[name]} (CHANGELOG.md, 'Renamed'): "
        f"write {SETTINGS[name]} in the recipe, --model.init_args.{SETTINGS[name].split(' ')[0]}=... on the "
        "command line"
    )


def as_given(message: str, argv: Sequence[str]) -> str:
    """A settings error as the user wrote it: jsonargparse reports a nested group's unknown field
    without its prefix (``--warm_start.foo=1`` for ``--model.init_args.warm_start.foo=1``); a
    renamed setting gets its new name."""
    null = NULL_GIVEN.search(message)
    if null and "Given value: None" in message:  # jsonargparse reads a group field's null as the text "None"
        key = null.group(1)
        return (
            f"--model.init_args.{key}=null: on the command line jsonargparse reads null in a settings group as "
            f'the text "None"; write an empty list (--model.init_args.{key}=[]) where the field is a list, or '
            f"set it to null in a --config file (model: init_args: {key.replace('.', ': ')}: null)"
        )
    found = NOT_ACCEPTED.search(message)
    if found:
        hint = renamed_setting(found.group(1))
        return f"{message}: {hint}" if hint else message
    found = UNRECOGNIZED.search(message)
    if not found:
        return message
    words = found.group(1).split()
    given = [
        next((a for a in argv if a.startswith("--") and a.endswith("." + w.lstrip("-"))), w) for w in words
    ]
    message = message[: found.start(1)] + " ".join(given)
    for word in given:
        hint = renamed_setting(word.split("=", 1)[0]) or renamed_option([word])
        if hint:
            return f"{message}: {hint}"
    return message
