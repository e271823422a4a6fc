"""The classification twin without annotations (configs/ci/classification_unannotated.yaml): what ImageNet
trains with, on the twin; the annotated twin keeps its own settings (make demo unchanged)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import REPO, composed_config

CONFIGS = REPO / "configs" / "ci"


def composed(tmp_path: Path, *configs: Path) -> dict:
    return composed_config(tmp_path / "config.yaml", *configs)


def schedule(config: dict) -> dict:
    """The SplitSchedule callback's settings in a composed config."""
    (found,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("SplitSchedule")]
    return found["init_args"]


def test_the_overlay_trains_as_the_recipe_does_without_boxes(tmp_path) -> None:
    recipe = REPO / "tasks" / "imagenet.yaml"
    twin = composed(tmp_path, recipe, CONFIGS / "classification.yaml")
    bare = composed(
        tmp_path, recipe, CONFIGS / "classification.yaml", CONFIGS / "classification_unannotated.yaml"
    )
    alone = composed(tmp_path, recipe)["model"]["init_args"]
    model, data = bare["model"]["init_args"], bare["data"]["init_args"]
    assert data["objects"] is None and twin["data"]["init_args"]["objects"] == "objects.json"
    assert model["warm_start"]["label_source"] == alone["warm_start"]["label_source"] == "fidelity"
    assert twin["model"]["init_args"]["warm_start"]["label_source"] == "annotations"
    assert model["ppo"]["samples"] == alone["ppo"]["samples"] == 8
    assert model["tokenizer"]["decision_features"] == alone["tokenizer"]["decision_features"] == "mlp"
    assert twin["model"]["init_args"]["tokenizer"]["decision_features"] == "linear"
    assert model["warm_start"]["teacher_forcing"] == alone["warm_start"]["teacher_forcing"] == 0.0
    assert twin["model"]["init_args"]["ppo"]["samples"] == 4
    assert twin["model"]["init_args"]["warm_start"]["teacher_forcing"] == 0.5
    assert (
        model["ppo"]["imitation"] == alone["ppo"]["imitation"] == 0.0
    )  # unanchored: the fidelity labels' default is 1
    assert "oracle" not in model["evaluation"]["eval_baselines"]
    # everything else is the twin's: the overlay changes what the missing boxes change, and takes the
    # recipe's decision module (the twin keeps its linear one, measured with the boxes as labels)
    for key in ("budget", "budget_range", "optim", "controller", "backbone_kwargs"):
        assert model[key] == twin["model"]["init_args"][key], key
    assert {**model["tokenizer"], "decision_features": "linear"} == twin["model"]["init_args"]["tokenizer"]
    assert model["evaluation"]["eval_budgets"] == twin["model"]["init_args"]["evaluation"]["eval_budgets"]
    # and the PPO stage doubled (the twin's 150 steps are short for learning from the task loss alone)
    assert schedule(bare)["rl_epochs"] == 2 * schedule(twin)["rl_epochs"] == 4
    assert schedule(bare)["warm_start_epochs"] == schedule(twin)["warm_start_epochs"]
    assert bare["trainer"]["max_epochs"] == twin["trainer"]["max_epochs"] + 2
    assert [c["class_path"] for c in bare["trainer"]["callbacks"]] == [
        c["class_path"] for c in twin["trainer"]["callbacks"]
    ]
    rest = ("callbacks", "max_epochs")
    assert {k: v for k, v in bare["trainer"].items() if k not in rest} == {
        k: v for k, v in twin["trainer"].items() if k not in rest
    }


def test_the_overlay_reaches_the_split_stage_alone(tmp_path, monkeypatch) -> None:
    """`run_pipeline(split_only=...)` gives the overlay to the SPLIT stage only: read by the dense stage
    too, its schedule (SplitSchedule without dense epochs, max_epochs 5) replaced the dense stage's and
    the backbone trained as a warm start and PPO (uniform 0.848 top-1 against 0.997, seed 1)."""
    from splitlab.commands import demo

    out = tmp_path / "run"
    (out / "data").mkdir(parents=True)
    (out / "data" / ".complete").write_text('{"task": "classification", "seed": 1, "background": "busy"}')
    stages: list[list[str]] = []

    def fit(args: list[str]) -> None:  # records each stage's command instead of training
        stages.append(args)
        if "--trainer.logger.init_args.version=pretrain" not in args:
            (out / "summary.json").write_text('{"policies": {}}')

    monkeypatch.setattr(demo, "fit", fit)
    overlay = str(CONFIGS / "classification_unannotated.yaml")
    demo.run_pipeline(
        out, seed=1, quiet=True, extra=["--data.init_args.batch_size=8"], split_only=["--config", overlay]
    )
    dense, split = stages
    assert "--trainer.logger.init_args.version=pretrain" in dense and overlay not in dense
    assert split[-2:] == ["--config", overlay]
    assert "--data.init_args.batch_size=8" in dense and "--data.init_args.batch_size=8" in split
