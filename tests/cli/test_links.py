"""One setting per quantity: the data's ``img_size`` and ``num_classes`` follow the model's (links),
every recipe states each once, and a data setting a link would drop is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from splitlab.cli import lightning_main
from splitlab.cli.links import INSTEAD, given_data_settings, model_input_size, refuse_linked_settings
from tests.helpers import REPO, composed_config, schedule_args, twin_configs

RECIPES = (
    sorted((REPO / "tasks").glob("*.yaml"))
    + sorted((REPO / "configs" / "ci").glob("*.yaml"))
    + sorted((REPO / "configs" / "towers").glob("*.yaml"))
    + sorted((REPO / "configs" / "tight_budget").glob("*.yaml"))
)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recipe_states_the_image_size_and_classes_once(path: Path) -> None:
    assert given_data_settings(["--config", str(path)]) == []  # no data setting that the model's sets
    model = (yaml.safe_load(path.read_text()).get("model") or {}).get("init_args") or {}
    if path.parent.name in ("tasks", "towers"):  # the paper-scale recipes: the model's input size is known
        assert model_input_size(model["backbone"], model.get("backbone_kwargs")) in (336, 384, 448, 640, 1024)


def test_the_siglip_tower_overrides_the_vqa_recipe(tmp_path) -> None:
    """configs/towers/siglip_so400m.yaml over tasks/vqav2.yaml: LLaVA-OneVision's tower, LM and
    normalisation, the rest the recipe's (checked by the composed config, nothing downloaded)."""
    composed = composed_config(
        tmp_path / "composed.yaml",
        REPO / "tasks" / "vqav2.yaml",
        REPO / "configs" / "towers" / "siglip_so400m.yaml",
    )
    model, data = composed["model"]["init_args"], composed["data"]["init_args"]
    assert model["backbone"] == "vit_so400m_patch14_siglip_384.webli" and "onevision" in model["lm"]
    assert model["tokenizer"]["levels"] == [56, 28, 14] and model["feature_block"] == -2
    assert data["mean"] == [0.5, 0.5, 0.5] and data["pad"] == "centre"
    assert model_input_size(model["backbone"], model.get("backbone_kwargs")) == 384  # 27 x 27 patches of 14
    assert composed["trainer"]["callbacks"][0]["class_path"] == "splitlab.callbacks.SplitSchedule"


def test_the_input_size_comes_from_the_kwargs_or_the_timm_model() -> None:
    assert model_input_size("vit_large_patch14_clip_336.laion2b_ft_in12k_in1k", None) == 336
    assert model_input_size("eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", {"img_size": 640}) == 640
    assert model_input_size("vit_tiny_patch16_224", {"img_size": [64, 64]}) == 64
    with pytest.raises(ValueError, match="give model.init_args.backbone_kwargs.img_size"):
        model_input_size("not_a_timm_model", {})
    assert model_input_size("vit_tiny_patch16_224", {"img_size": [64, 96]}) == [64, 96]  # classification


@pytest.mark.parametrize("name", ["img_size", "num_classes"])
def test_a_data_setting_other_than_the_models_is_refused_naming_the_models(name: str, tmp_path) -> None:
    model = {name: 64}
    for command in (["fit", f"--data.init_args.{name}=150"], ["fit", f"--data.init_args.{name}", "150"]):
        with pytest.raises(
            ValueError,
            match=rf"data.init_args.{name}=150 \(in the command line\) differs .* set {INSTEAD[name]}",
        ):
            refuse_linked_settings(command, model)
        refuse_linked_settings(command, {name: 150})  # the model's own value passes
    config = tmp_path / "mine.yaml"  # e.g. a run's config.yaml saved before the links: both stated
    config.write_text(yaml.safe_dump({"data": {"init_args": {name: 150}}}))
    with pytest.raises(ValueError, match=rf"data.init_args.{name}=150 \(in {config}\)"):
        refuse_linked_settings(["fit", "--config", str(config)], model)
    refuse_linked_settings(["fit", "--config", str(config)], {name: 150})


def test_the_ade20k_twin_on_a_150_class_folder_needs_only_the_models_num_classes(ade_root, tmp_path) -> None:
    """A label 150 (ADE20K's last class) in the data: with the data's own num_classes=5 it was skipped
    as out of range; the model's 150 now reaches the data."""
    root = tmp_path / "ade150"
    shutil.copytree(ade_root, root)
    for annotation in sorted((root / "annotations").rglob("*.png")):
        labels = np.array(Image.open(annotation))
        labels[:8, :8] = 150
        Image.fromarray(labels).save(annotation)

    def fit(classes: int, run: str):
        return lightning_main(
            [
                "fit",
                *twin_configs("ade20k"),
                f"--data.init_args.root={root}",
                "--data.init_args.strict=true",  # an out-of-range label stops the run
                f"--model.init_args.num_classes={classes}",
                f"--trainer.logger.init_args.save_dir={tmp_path / run}",
                "--trainer.enable_progress_bar=false",
                "--model.init_args.backbone_kwargs.embed_dim=32",
                "--model.init_args.backbone_kwargs.num_heads=2",
                "--model.init_args.evaluation.eval_baselines=[uniform]",
                *schedule_args(1, 0),
            ]
        )

    cli = fit(150, "run")
    assert cli.datamodule.num_classes == cli.model.num_classes == 150
    assert cli.trainer.state.finished
    with pytest.raises(
        ValueError, match=r"label value 150 is above num_classes=149"
    ):  # the data has the model's
        fit(149, "short")
