"""Token-map pictures: the quadtree drawn over a few validation images, saved and logged."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from PIL import Image, ImageDraw
from torch import Tensor

from splitlab.tokenizer import TokenLayout

LEVEL_COLOURS = ((255, 64, 64), (255, 200, 0), (64, 220, 64), (64, 160, 255))


def draw_tile(
    image: Tensor,
    tokens: Sequence[Sequence[int]],
    mean: Sequence[float],
    std: Sequence[float],
    num_levels: int,
    scale: int = 1,
) -> Image.Image:
    """One normalised ``(3, H, W)`` image, dimmed, with each token ``[x0, y0, x1, y1, level]`` (pixels)
    outlined (colour by level: coarse red -> fine blue)."""
    x = image.detach().float().cpu()
    x = x * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)
    x = 0.25 + 0.5 * x.clamp(0, 1)  # dimmed, so the boxes stand out on busy images
    x = (x * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    h, w = x.shape[0] * scale, x.shape[1] * scale
    tile = Image.fromarray(np.ascontiguousarray(x)).resize((w, h), Image.NEAREST)
    draw = ImageDraw.Draw(tile)
    for x0, y0, x1, y1, level in tokens:
        colour = LEVEL_COLOURS[level % len(LEVEL_COLOURS)]
        width = 2 if scale > 1 and level < num_levels - 1 else 1
        draw.rectangle([x0 * scale, y0 * scale, x1 * scale - 1, y1 * scale - 1], outline=colour, width=width)
    return tile


def draw_token_map(
    images: Tensor,
    layout: TokenLayout,
    mean: Sequence[float],
    std: Sequence[float],
    count: int = 8,
    scale: int = 1,
) -> Image.Image:
    """A row of images with each token's box outlined (`draw_tile`)."""
    count = min(count, images.shape[0])
    h, w = images.shape[-2] * scale, images.shape[-1] * scale
    sheet = Image.new("RGB", (count * (w + 4), h), (0, 0, 0))
    for i, tokens in enumerate(layout.token_boxes()[:count]):
        sheet.paste(draw_tile(images[i], tokens, mean, std, layout.levels.num, scale), (i * (w + 4), 0))
    return sheet


class TokenMapPictures(Callback):
    """Each validation, draw the learned layout over the first images and save a PNG.

    Files go to ``<log_dir>/token_maps/epoch_XXX.png`` (and to the logger when it takes images,
    e.g. TensorBoard). A budget-conditioned policy also gets ``budgets_epoch_XXX.png``: the first
    image at the lowest, deployed and highest budget, so one sees where the extra tokens go. A
    picture that cannot be written is a warning, not the end of the run.

    Args:
        num_images: images per picture.
        scale: upscaling of small images so boxes stay visible.
    """

    def __init__(self, num_images: int = 8, scale: int = 4) -> None:
        self.num_images = num_images
        self.scale = scale

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if (
            batch_idx != 0
            or trainer.sanity_checking
            or not isinstance(outputs, dict)
            or "layout" not in outputs
        ):
            return
        log_dir = trainer.log_dir or trainer.default_root_dir
        if not trainer.is_global_zero:
            return
        mean, std = pl_module.model.preprocessing.mean, pl_module.model.preprocessing.std
        images = outputs["images"]
        pictures = {
            "token_map": draw_token_map(images, outputs["layout"], mean, std, self.num_images, self.scale)
        }
        if getattr(pl_module.tokenizer, "budget_conditioned", False):
            pictures["budget_strip"] = self.budget_strip(pl_module, images[:1], mean, std)
        folder = Path(log_dir) / "token_maps"
        for name, picture in pictures.items():
            stem = "epoch" if name == "token_map" else "budgets_epoch"
            path = folder / f"{stem}_{trainer.current_epoch:03d}.png"
            try:  # an optional output: a picture that cannot be written must not stop training
                path.parent.mkdir(parents=True, exist_ok=True)
                picture.save(path)
            except OSError as err:
                rank_zero_warn(f"token map not written ({err}); training goes on")
            for logger in trainer.loggers:
                experiment = getattr(logger, "experiment", None)
                if hasattr(experiment, "add_image"):
                    experiment.add_image(name, np.asarray(picture), trainer.global_step, dataformats="HWC")

    def budget_strip(
        self, pl_module: LightningModule, image: Tensor, mean: Sequence[float], std: Sequence[float]
    ) -> Image.Image:
        """One image at the lowest, deployed and highest budget of a budget-conditioned policy."""
        lo, hi = pl_module.tokenizer.operating_points.range
        budgets = torch.tensor([lo, pl_module.budget, hi], device=image.device)
        images = image.expand(3, -1, -1, -1)
        with torch.no_grad():
            layout = pl_module.model.layout(images, budget=budgets, policy="learned")  # as deployed
        picture = draw_token_map(images, layout, mean, std, 3, max(self.scale, 2))
        draw = ImageDraw.Draw(picture)
        tile = picture.width // 3
        for i, (budget, fraction) in enumerate(zip(budgets.tolist(), layout.fraction.tolist(), strict=True)):
            draw.text((i * tile + 3, 2), f"budget {budget:.2f}: {fraction:.2f}", fill=(255, 255, 255))
        return picture
