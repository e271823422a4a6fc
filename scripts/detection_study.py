"""Why a detection run's learned policy does (not) beat random: the measurements behind docs/detection.md.

    python scripts/detection_study.py RUN_DIR [--ckpt CKPT] [--fractions 0.3,0.5,0.7,0.9] [--images 64]

RUN_DIR is what `splitlab demo --task coco` (or a fit) leaves: ``config.yaml``, a checkpoint and the
data root its config names. Printed, as one JSON record per section:

- ``twin``: objects per image, their sides in finest cells, the share of finest cells they touch;
- ``curve``: validation mAP and object fine coverage of the learned, random, entropy (per-batch cut)
  and oracle layouts at each fraction, and of the uniform grid. The oracle splits the patches the
  ground-truth boxes cover most (an upper bound no policy that sees only pixels is promised);
- ``signal``: the PPO reward's task loss on training images (reference proposals, one seed per image,
  as PPO scores rollouts): per-image loss of the uniform grid, the oracle, its inverse (objects
  coarse) and random layouts at the run's budget, and of the policy's own samples; the spread of
  rollouts of one image against the spread between images.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml
from torch import Tensor

import splitlab
from splitlab.data import CocoDetectionData
from splitlab.heads import without_crowd
from splitlab.metrics import coco_truth, detection_metrics, instance_label_map
from splitlab.tokenizer import Levels, TokenLayout
from splitlab.tokenizer.baselines import calibrate_threshold


def box_cover(boxes: list[Tensor], levels: Levels, size: tuple[int, int]) -> list[Tensor]:
    """Per non-finest level ``(B, h, w)``: the share of each patch that ground-truth boxes cover."""
    masks = torch.zeros(len(boxes), *size)
    for i, b in enumerate(boxes):
        for x0, y0, x1, y1 in b.round().long().tolist():
            masks[i, y0:y1, x0:x1] = 1.0
    out = []
    for k in range(levels.num - 1):
        side = levels.sizes[k]
        out.append(torch.nn.functional.avg_pool2d(masks[:, None], side)[:, 0])
    return out


def oracle_layout(
    model, images: Tensor, targets: list[dict], fraction: float, invert: bool = False
) -> TokenLayout:
    """Split the patches the boxes cover most (``invert``: least) until the batch meets ``fraction``."""
    cover = box_cover([t["boxes"] for t in targets], model.levels, tuple(images.shape[-2:]))
    scores = [(-c if invert else c) + 1e-3 * torch.rand_like(c) for c in cover]  # ties broken at random
    cut = calibrate_threshold(scores, fraction)
    return model.tokenizer(images, model.backbone, mode="scores", scores=scores, threshold=cut)


def learned_layout(model, images: Tensor, fraction: float) -> TokenLayout:
    """The deployed layout at the run's budget; at another budget (a policy trained for one) its
    logits ranked and cut per batch, as the entropy rows are."""
    if abs(fraction - model.budget) < 1e-6:
        return model.layout(images)
    tokens, _ = model.tokenizer.embed(images, model.backbone)
    logits = model.tokenizer.decision_logits(tokens, model.budget)
    return model.tokenizer.tokenize(
        tokens, "scores", scores=logits, threshold=calibrate_threshold(logits, fraction)
    )


def twin_stats(dataset_targets: list[dict], cell: int, grid: int) -> dict:
    counts = [len(t["boxes"]) for t in dataset_targets]
    sides = torch.cat([(t["boxes"][:, 2:] - t["boxes"][:, :2]).max(1).values for t in dataset_targets]) / cell
    touched = []
    for t in dataset_targets:
        m = torch.zeros(grid, grid, dtype=torch.bool)
        for x0, y0, x1, y1 in t["boxes"].tolist():
            m[int(y0) // cell : int(-(-y1 // cell)), int(x0) // cell : int(-(-x1 // cell))] = True
        touched.append(m.float().mean())
    return {
        "images": len(counts),
        "objects_per_image": sum(counts) / len(counts),
        "side_in_finest_cells": {
            "min": float(sides.min()),
            "median": float(sides.median()),
            "max": float(sides.max()),
        },
        "finest_cells_touched": float(torch.stack(touched).mean()),
    }


@torch.no_grad()
def curve(model, loader, fractions: list[float], max_batches: int) -> dict:
    cell = model.levels.finest
    rows: dict[str, dict] = {}

    def evaluate(name: str, layouts) -> None:
        """mAP and object coverage of ``(layout, targets)`` pairs."""
        metrics = detection_metrics(cell)
        realised = []
        for layout, targets in layouts:
            out = model.forward_layout(layout)
            preds, truth = [], []
            for det, tgt in zip(model.head.detect(out), targets, strict=True):
                preds.append({"boxes": det["boxes"], "scores": det["scores"], "labels": det["labels"]})
                truth.append(coco_truth(tgt))
            metrics["map"].update(preds, truth)
            size = tuple(h * cell for h in layout.grid_size)
            maps = [instance_label_map(t["boxes"], t["labels"], size, t.get("masks")) for t in targets]
            metrics["coverage"].update(layout, torch.stack(maps))
            realised.append(layout.fraction.mean())
        result = metrics.compute()
        rows[name] = {
            "map": round(float(result["map"]), 4),
            "fraction": round(float(torch.stack(realised).mean()), 3),
            "object_fine_coverage": round(float(result["object_fine_coverage"]), 3),
        }

    batches = [b for _, b in zip(range(max_batches), loader, strict=False)]
    evaluate("uniform", ((model.layout(x, policy="uniform", budget=1.0), t) for x, t in batches))
    for f in fractions:
        learned = [(learned_layout(model, x, f), t) for x, t in batches]
        evaluate(f"learned@{f}", iter(learned))
        got = [max(float(lay.fraction.mean()), model.levels.min_fraction) for lay, _ in learned]
        for policy in ("random", "entropy"):
            evaluate(
                f"{policy}@{f}",
                (
                    (model.layout(x, policy=policy, budget=g, seed=i), t)
                    for i, ((x, t), g) in enumerate(zip(batches, got, strict=True))
                ),
            )
        evaluate(f"oracle@{f}", ((oracle_layout(model, x, t, f), t) for x, t in batches))
    return rows


@torch.no_grad()
def signal(model, loader, budget: float, rollouts: int, max_images: int) -> dict:
    """Per-image PPO task loss of layouts of the same images (reference proposals, seeded per image)."""
    losses: dict[str, list[Tensor]] = {k: [] for k in ("uniform", "oracle", "inverse", "random", "policy")}
    seen = 0
    generator = torch.Generator().manual_seed(0)
    for images, targets in loader:
        if seen >= max_images:
            break
        instances = [without_crowd(t) for t in targets]
        seeds = [1000 + seen + i for i in range(len(targets))]

        def loss_of(layout: TokenLayout, instances=instances, seeds=seeds) -> Tensor:
            return model.head.per_image_loss(model.forward_layout(layout), instances, seeds, reference=True)

        losses["uniform"].append(loss_of(model.layout(images, policy="uniform", budget=1.0)))
        losses["oracle"].append(loss_of(oracle_layout(model, images, targets, budget)))
        losses["inverse"].append(loss_of(oracle_layout(model, images, targets, budget, invert=True)))
        losses["random"].append(
            torch.stack(
                [
                    loss_of(model.layout(images, policy="random", budget=budget, seed=s))
                    for s in range(rollouts)
                ]
            )
        )
        tokens, _ = model.tokenizer.embed(images, model.backbone)
        logits = model.tokenizer.decision_logits(tokens, budget)
        losses["policy"].append(
            torch.stack(
                [
                    loss_of(model.tokenizer.tokenize(tokens, "sample", logits=logits, generator=generator))
                    for _ in range(rollouts)
                ]
            )
        )
        seen += len(targets)
    cat = {k: torch.cat(v, -1) for k, v in losses.items()}
    out: dict[str, float] = {f"mean_loss_{k}": round(float(v.mean()), 4) for k, v in cat.items()}
    for k in ("random", "policy"):
        v = cat[k]  # (rollouts, images)
        out[f"{k}_within_image_std"] = round(float(v.std(0).mean()), 4)
        out[f"{k}_between_image_std"] = round(float(v.mean(0).std()), 4)
    out["oracle_below_random_mean_share"] = round(
        float((cat["oracle"] < cat["random"].mean(0)).float().mean()), 3
    )
    out["inverse_minus_oracle"] = round(float((cat["inverse"] - cat["oracle"]).mean()), 4)
    out["images"] = seen
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--ckpt", type=Path, default=None, help="default RUN/checkpoints/last.ckpt")
    parser.add_argument("--fractions", default="0.3,0.5,0.7,0.9")
    parser.add_argument("--batches", type=int, default=5, help="validation batches for the curve")
    parser.add_argument("--images", type=int, default=64, help="training images for the signal")
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--sections", default="twin,curve,signal")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    data_args = {
        k: v for k, v in config["data"]["init_args"].items() if k in ("root", "img_size", "mean", "std")
    }
    data = CocoDetectionData(**data_args, masks=False, batch_size=16, num_workers=0)
    data.setup("fit")
    model = splitlab.load(args.ckpt or args.run).eval()
    sections = args.sections.split(",")
    grid = data_args["img_size"] // model.levels.finest
    if "twin" in sections:
        targets = [data.datasets["val"][i][1] for i in range(len(data.datasets["val"]))]
        print(json.dumps({"twin": twin_stats(targets, model.levels.finest, grid)}))
    fractions = [float(f) for f in args.fractions.split(",")]
    if "curve" in sections:
        print(json.dumps({"curve": curve(model, data.val_dataloader(), fractions, args.batches)}))
    if "signal" in sections:
        loader = data._loader("train", shuffle=False)
        print(json.dumps({"signal": signal(model, loader, model.budget, args.rollouts, args.images)}))


if __name__ == "__main__":
    main()
