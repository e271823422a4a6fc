"""configs/tight_budget/: the settings measured to beat APT where the budget binds (docs/hard_twins.md,
"The learned policy against APT at every budget"), as overlays on each dense recipe. Each must build
the very configuration those measurements ran from the command line, and leave the rest alone."""

from __future__ import annotations

import pytest

from splitlab.commands.demo import PIPELINES, ci_recipe
from tests.helpers import REPO, composed_config

# what the measured runs gave `splitlab demo --task T --difficulty hard --reuse ...` (docs/loss_labels.md)
MEASURED_FLAGS = {
    "ade20k": [
        "--model.init_args.budget=0.3",
        "--model.init_args.warm_start.label_source=fidelity",
        "--model.init_args.warm_start.loss_steps=4",
        "--model.init_args.tokenizer.decision_features=mlp",
    ],
    "coco": [
        "--model.init_args.budget=0.3",
        "--model.init_args.warm_start.label_source=fidelity",
        "--model.init_args.warm_start.teacher_forcing=1.0",
    ],
}


def overlay(task: str) -> str:
    return str(REPO / "configs" / "tight_budget" / f"{task}.yaml")


@pytest.mark.parametrize("task", sorted(MEASURED_FLAGS))
def test_the_overlay_on_the_hard_twin_is_the_measured_command_line(task, tmp_path) -> None:
    twin = ci_recipe(task, "hard")[1::2]
    composed = composed_config(tmp_path / "overlay.yaml", *twin, overlay(task))
    assert composed == composed_config(tmp_path / "flags.yaml", *twin, flags=MEASURED_FLAGS[task])


@pytest.mark.parametrize("task", sorted(MEASURED_FLAGS))
def test_the_overlay_changes_only_the_budget_and_the_policy_settings_of_the_recipe(task, tmp_path) -> None:
    recipe = REPO / "tasks" / PIPELINES[task][0]
    before = composed_config(tmp_path / "recipe.yaml", recipe)
    after = composed_config(tmp_path / "tight.yaml", recipe, overlay(task))
    assert after["trainer"] == before["trainer"] and after["data"] == before["data"]
    model, was = after["model"]["init_args"], before["model"]["init_args"]
    changed = {k for k in model if model[k] != was[k]}
    assert changed == {"budget", "warm_start"} | ({"tokenizer"} if task == "ade20k" else set())
    assert model["budget"] == 0.3 and model["warm_start"]["label_source"] == "fidelity"
    assert model["backbone"] == was["backbone"]  # the recipe's ViT, not the twin's
