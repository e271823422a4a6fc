"""Where a classification run's learned layout misses the object: the measurement behind docs/budgets.md
("Where the learned policy loses"), on data from `splitlab data shapes` (its ``objects.json``).

    python scripts/object_misses.py RUN_DIR [--budget 0.5] [--split val] [--root DATA]

RUN_DIR is what `splitlab demo` (or a fit) leaves: ``config.yaml``, ``checkpoints/last.ckpt`` and the
data root its config names. For each image: are all the coarsest patches the object touches split?
Top-1 is reported for both groups, and the misses are divided into objects inside one coarse patch and
objects straddling several (with the share of the object in the patch left whole). Then the finest
level: the share of the object's finest cells that get finest tokens, the images where none or under
half of them do, and in how many of those the policy ranked the coarse patch holding most of the object
first (docs/loss_labels.md, "A nonlinearity per patch"). The layouts are the deployed
ones (`splitlab.load`: budget and cap as the run deploys them). ``--root`` reads another data root of
the same layout, e.g. the held-out set `splitlab demo --heldout` leaves in ``RUN_DIR/heldout-data``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image

import splitlab


def touched(box: list[int], size: int) -> list[tuple[int, int]]:
    """``(row, col)`` of the ``size``-px patches the box ``[x0, y0, x1, y1]`` overlaps."""
    x0, y0, x1, y1 = box
    return [
        (r, c)
        for r in range(y0 // size, (y1 - 1) // size + 1)
        for c in range(x0 // size, (x1 - 1) // size + 1)
    ]


def share_in(box: list[int], patch: tuple[int, int], size: int) -> float:
    """Share of the box's area inside one patch."""
    x0, y0, x1, y1 = box
    r, c = patch
    width = max(0, min(x1, size * (c + 1)) - max(x0, size * c))
    height = max(0, min(y1, size * (r + 1)) - max(y0, size * r))
    return width * height / ((x1 - x0) * (y1 - y0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--budget", type=float, default=None, help="default: the run's target_fraction")
    parser.add_argument("--split", default="val")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--root", type=Path, default=None, help="default: the run's data root")
    args = parser.parse_args()
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    root = Path(config["data"]["init_args"]["root"]) if args.root is None else args.root
    boxes = json.loads((root / "objects.json").read_text())[args.split]
    classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())  # ImageFolder's order
    model = splitlab.load(args.run)
    budget = model.budget if args.budget is None else args.budget
    coarse, finest, last = model.levels.sizes[0], model.levels.finest, model.levels.num - 1
    names = list(boxes)
    correct, fractions = [], []
    patches = {n: touched(boxes[n], coarse) for n in names}  # the coarse patches each object touches
    missed_patches: list[list[tuple[int, int]]] = []  # per image, those left whole
    covered: list[float] = []  # per image, the share of the object's finest cells at the finest level
    first: list[bool] = []  # per image: is the coarse patch holding most of the object the policy's first?
    with torch.no_grad():
        for start in range(0, len(names), args.batch_size):
            chunk = names[start : start + args.batch_size]
            images = torch.stack([model.preprocessing(Image.open(root / n))[0] for n in chunk])
            outputs, layout = model(images, budget=budget)
            predicted = outputs.argmax(-1)
            decisions = layout.decisions  # where a decision was taken: every coarsest patch
            labels = torch.tensor([classes.index(Path(n).parent.name) for n in chunk])
            correct += (predicted == labels).tolist()
            fractions += layout.fraction.tolist()
            fine = (layout.level_map() == last).cpu()
            coarse_logits = layout.logits[0].flatten(1).cpu()
            for i, name in enumerate(chunk):
                missed_patches.append([(r, c) for r, c in patches[name] if not decisions[0][i, r, c]])
                cells = [
                    (r, c) for r, c in touched(boxes[name], finest) if r < fine.shape[1] and c < fine.shape[2]
                ]
                covered.append(float(np.mean([bool(fine[i, r, c]) for r, c in cells])) if cells else 1.0)
                r, c = max(patches[name], key=lambda p: share_in(boxes[name], p, coarse))
                first.append(bool(coarse_logits[i].argmax() == r * decisions[0].shape[2] + c))
    correct_arr = np.array(correct)
    missed = np.array([bool(m) for m in missed_patches])
    inside = sum(1 for n, m in zip(names, missed_patches, strict=True) if m and len(patches[n]) == 1)
    shares = [
        share_in(boxes[n], p, coarse)
        for n, m in zip(names, missed_patches, strict=True)
        if len(patches[n]) > 1
        for p in m
    ]
    errors = int((~correct_arr).sum())
    print(
        f"{args.run} at budget {budget:g}: top-1 {correct_arr.mean():.3f}, fraction {np.mean(fractions):.3f}, {len(names)} images"
    )
    print(
        f"  every coarse ({coarse} px) patch of the object split: {int((~missed).sum())} images, top-1 {correct_arr[~missed].mean():.3f}"
    )
    if missed.any():
        share = (~correct_arr[missed]).sum() / errors if errors else 0.0
        print(
            f"  one left whole: {int(missed.sum())} images, top-1 {correct_arr[missed].mean():.3f} ({share:.0%} of the errors); "
            f"object inside one patch {inside}, straddling {int(missed.sum()) - inside} "
            f"(median share of the object in the patch left whole {np.median(shares) if shares else 0:.2f})"
        )
    share = np.array(covered)
    print(f"  the object's finest ({finest} px) cells with finest tokens: {share.mean():.3f} on average")
    ranked = np.array(first)
    for name, group in (("none", share == 0), ("under half", (share > 0) & (share < 0.5))):
        if group.any():
            print(
                f"  {name} of them: {int(group.sum())} images, top-1 {correct_arr[group].mean():.3f}; the coarse "
                f"patch holding most of the object was the policy's first choice in {int(ranked[group].sum())}"
            )


if __name__ == "__main__":
    main()
