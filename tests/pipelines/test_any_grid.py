"""Grids the coarsest level does not divide train end to end: the classification twin on a 27 x 27, a
37 x 37 and a non-square 24 x 32 patch grid (clipped edge patches where the coarsest level does not
divide it) through warm start and PPO meets its budget, and the trained model's uniform layout is its
timm model's own forward."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import splitlab
from tests.helpers import fit


@pytest.mark.parametrize(
    ("img_size", "grid"),
    [(54, (27, 27)), (74, (37, 37)), ([48, 64], (24, 32))],
    ids=["27x27", "37x37", "24x32"],
)
def test_an_odd_grid_trains_meets_its_budget_and_stays_timm_on_the_uniform_layout(
    shapes_root, tmp_path, img_size, grid
) -> None:
    fit(
        shapes_root,
        tmp_path,
        f"--model.init_args.backbone_kwargs.img_size={img_size}",
        "--model.init_args.backbone_kwargs.patch_size=2",
        "--model.init_args.tokenizer.levels=[8,4,2]",
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trained_policy"] == "learned"
    learned = summary["policies"]["learned"]
    assert learned["token_fraction_mean"] == pytest.approx(0.5, abs=0.03)
    model = splitlab.load(tmp_path).eval()
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
    assert model.preprocessing.shape == (height, width)
    images = torch.randn(3, 3, height, width)
    with torch.no_grad():
        uniform, layout = model(images, policy="uniform")
        mixed, mixed_layout = model(images)
        timm_logits = model.backbone.model(images)  # the timm model itself, with the trained weights
    cells = grid[0] * grid[1]
    assert layout.grid_size == grid and layout.seqlens == [cells] * 3
    assert (uniform - timm_logits).abs().max() <= 1e-5
    assert max(mixed_layout.seqlens) < cells  # a mixed layout, no box past the grid
    assert int(mixed_layout.boxes[:, 2].max()) == grid[1] and int(mixed_layout.boxes[:, 3].max()) == grid[0]
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 90, 3), dtype=np.uint8))
    predicted = model.predict([photo])  # a file's size: resized and cropped to the model's input
    assert 0 < predicted[0]["token_fraction"] < 1
