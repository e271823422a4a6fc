"""SPLIT in a plain PyTorch training loop: no Lightning, no splitlab task, your own timm ViT.

The two stages of the paper, written out with splitlab's plain-torch parts:

1. warm start: the decision module imitates split labels from parent-child embedding differences
   (`warm_start_labels`) while the backbone and head fine-tune on those mixed-resolution layouts;
2. PPO: backbone and head frozen, the policy samples layouts (`tokenize(..., "sample")`), each
   scored by reward = -loss - lambda * token fraction (`FractionController` moves lambda until the
   mean fraction meets the budget), advantages against the image's mean reward, clipped surrogate
   per decision: splitlab's own `roll_out` and `policy_loss` (`splitlab.training.steps`), the steps
   the Lightning task runs, here with a plain backward.

Then the deployed cut is calibrated on training images (`calibrate`) and the model saved in the
Hugging Face layout, which `splitlab.load` reads:

    splitlab data shapes --out data/generated/shapes
    python examples/plain_pytorch.py --data data/generated/shapes --out runs/plain
    python -c "import splitlab; print(splitlab.load('runs/plain').predict('photo.jpg'))"

The tiny ViT here starts from random weights, as CI has no pretrained ones: on the generated shapes
(50 training images per class) 200 warm-start and 100 PPO steps take 18 s on 2 CPU cores and reach
0.375 top-1 on 40 test images at 0.47 of the tokens (2026-12-04), which shows the loop runs, not what
SPLIT keeps: start from a pretrained ViT, or train it densely first, as the CI twins do.
`tests/examples/test_plain_pytorch.py` runs it for a few steps.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from splitlab import SplitModel
from splitlab.model.calibrate import calibrate
from splitlab.rl import FractionController, PPOConfig
from splitlab.tokenizer import warm_start_labels
from splitlab.training import imitation_loss, policy_loss, roll_out


def backward(loss: torch.Tensor) -> None:
    """A plain loop's backward (Lightning Fabric passes its own: examples/fabric.py)."""
    loss.backward()


def warm_start_step(
    model: SplitModel, images, targets, optimizer, budget: float, backward: Callable = backward
) -> float:
    """Backbone and head learn on the label layouts, the decision module imitates the labels."""
    tokens, _ = model.tokenizer.embed(images, model.backbone)
    with torch.no_grad():  # the labels read the patch content, they are no training target of it
        labels, _ = warm_start_labels(
            model.tokenizer.embed.content(images, model.backbone), model.levels, budget
        )
    logits = model.tokenizer.decision_logits(tokens, budget)
    layout = model.tokenizer.tokenize(tokens, "labels", labels=labels, logits=logits)
    loss = F.cross_entropy(model.forward_layout(layout), targets) + imitation_loss(logits, labels)
    optimizer.zero_grad()
    backward(loss)
    optimizer.step()
    return loss.item()


def ppo_step(
    model: SplitModel,
    images,
    targets,
    optimizer,
    controller: FractionController,
    budget: float,
    cfg: PPOConfig,
    generator: torch.Generator,
    backward: Callable = backward,
) -> float:
    """One PPO update of the decision module on ``cfg.samples`` sampled layouts per image (splitlab's
    own `roll_out` and `policy_loss`, which the Lightning task runs too); the mean sampled fraction."""
    samples = cfg.samples

    def loss_of(layouts):  # each rollout's task loss, through the frozen backbone and head
        return F.cross_entropy(model.forward_layout(layouts), targets.repeat(samples), reduction="none")

    rolled = roll_out(model, images, budget, float(controller.values[0]), samples, loss_of, generator)
    for _ in range(cfg.epochs):
        surrogate, _, _ = policy_loss(model, rolled, budget, cfg)
        optimizer.zero_grad()
        backward(surrogate)
        torch.nn.utils.clip_grad_norm_(model.tokenizer.parameters(), cfg.max_grad_norm)
        optimizer.step()
    controller.update(rolled.layouts.fraction.mean(), 0)  # lambda rises while the fraction is over budget
    return float(rolled.layouts.fraction.mean())


def batches(loader: DataLoader, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches, the loader's epochs repeated as needed."""
    done = 0
    while done < steps:
        for batch in loader:
            if done == steps:
                return
            yield batch
            done += 1


def train(
    data: Path,
    out: Path,
    warm_steps: int = 60,
    ppo_steps: int = 60,
    budget: float = 0.5,
    seed: int = 0,
    fabric: Any = None,
):
    """Train SPLIT on the ImageFolder ``data/train`` with a tiny ViT/8 at 64 px; save to ``out``.

    ``fabric``: a launched `lightning.fabric.Fabric` that places model, optimizers and batches and runs
    the backward (examples/fabric.py); the steps are the same functions either way."""
    torch.manual_seed(seed)
    train_set = datasets.ImageFolder(str(data / "train"))
    vit = timm.create_model(  # any timm ViT you have: pretrained=True where the hub is reachable
        "vit_tiny_patch16_224", img_size=64, patch_size=8, embed_dim=64, depth=2, num_heads=2,
        num_classes=len(train_set.classes),
    )  # fmt: skip
    model = SplitModel.from_timm(vit, levels=[32, 16, 8], budget=budget, decision_dim=32, decision_heads=2)
    model.names = train_set.classes
    pre = model.preprocessing  # what predict will apply to files: train on the same
    train_set.transform = transforms.Compose(
        [
            transforms.Resize((pre.img_size, pre.img_size)),
            transforms.ToTensor(),
            transforms.Normalize(pre.mean, pre.std),
        ]
    )
    loader = DataLoader(train_set, batch_size=16, shuffle=True)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    step_backward = backward
    if fabric is not None:  # Fabric places them; the steps call the model's own methods, as a plain loop's do
        _, optimizer = fabric.setup(model, optimizer)
        loader, step_backward = fabric.setup_dataloaders(loader), fabric.backward
    for images, targets in batches(loader, warm_steps):
        warm_start_step(model, images, targets, optimizer, budget, step_backward)

    model.backbone.requires_grad_(False)  # PPO: the task model is frozen, only the policy learns
    model.backbone.eval()
    policy_optimizer = torch.optim.Adam(model.tokenizer.decision.parameters(), lr=1e-3)
    if fabric is not None:
        policy_optimizer = fabric.setup_optimizers(policy_optimizer)
    controller = FractionController(budget, lr=0.2, gain=1.0)
    cfg = PPOConfig(samples=2, epochs=2)
    device = next(model.parameters()).device  # where Fabric put it (a plain loop: the CPU)
    controller.to(device)
    generator = torch.Generator(device).manual_seed(seed)
    for images, targets in batches(loader, ppo_steps):
        ppo_step(model, images, targets, policy_optimizer, controller, budget, cfg, generator, step_backward)

    model.eval()
    files = [path for path, _ in train_set.samples[:256]]  # read as predict reads them
    calibrated = calibrate(model, files)  # the deployed cut meets the budget on images like these
    model.save_pretrained(out)
    return model, calibrated


def arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The loop's options (examples/fabric.py adds Fabric's)."""
    parser.add_argument("--data", type=Path, required=True, help="an ImageFolder root with a train/ folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for the saved model (new)")
    parser.add_argument("--warm-steps", type=int, default=60)
    parser.add_argument("--ppo-steps", type=int, default=60)
    parser.add_argument("--budget", type=float, default=0.5)
    return parser


def main() -> None:
    args = arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0])).parse_args()
    _, calibrated = train(args.data, args.out, args.warm_steps, args.ppo_steps, args.budget)
    print(f"saved {args.out}: mean token fraction {calibrated.after:.3f} at budget {calibrated.budget}")


if __name__ == "__main__":
    main()
