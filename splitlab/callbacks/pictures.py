"""Token-map pictures: the quadtree drawn over a few validation images, saved and logged."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer
from PIL import Image, ImageDraw
from torch import Tensor

from splitlab.tokenizer import TokenLayout

LEVEL_COLOURS = ((255, 64, 64), (255, 200, 0), (64, 220, 64), (64, 160, 255))


def draw_token_map(
    images: Tensor,
    layout: TokenLayout,
    mean: Sequence[float],
    std: Sequence[float],
    count: int = 8,
    scale: int = 1,
) -> Image.Image:
    """A row of images with each token's box outlined (colour by level: coarse red -> fine blue)."""
    count = min(count, images.shape[0])
    x = images[:count].detach().float().cpu()
    x = x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)
    x = 0.25 + 0.5 * x.clamp(0, 1)  # dimmed, so the boxes stand out on busy images
    x = (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    h, w = x.shape[1] * scale, x.shape[2] * scale
    sheet = Image.new("RGB", (count * (w + 4), h), (0, 0, 0))
    finest = layout.levels.finest * scale
    boxes, levels = layout.split(layout.boxes), layout.split(layout.level)
    for i in range(count):
        tile = Image.fromarray(np.ascontiguousarray(x[i])).resize((w, h), Image.NEAREST)
        draw = ImageDraw.Draw(tile)
        for (x0, y0, x1, y1), level in zip(boxes[i].tolist(), levels[i].tolist(), strict=True):
            colour = LEVEL_COLOURS[level % len(LEVEL_COLOURS)]
            width = 2 if scale > 1 and level < layout.levels.num - 1 else 1
            draw.rectangle(
                [x0 * finest, y0 * finest, x1 * finest - 1, y1 * finest - 1], outline=colour, width=width
            )
        sheet.paste(tile, (i * (w + 4), 0))
    return sheet


class TokenMapPictures(Callback):
    """Each validation, draw the learned layout over the first images and save a PNG.

    Files go to ``<log_dir>/token_maps/epoch_XXX.png`` (and to the logger when it takes images,
    e.g. TensorBoard).

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
        mean, std = pl_module.normalisation
        picture = draw_token_map(outputs["images"], outputs["layout"], mean, std, self.num_images, self.scale)
        path = Path(log_dir) / "token_maps" / f"epoch_{trainer.current_epoch:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        picture.save(path)
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_image"):
                experiment.add_image("token_map", np.asarray(picture), trainer.global_step, dataformats="HWC")
