"""SPLIT trained with Lightning Fabric: the plain loop (examples/plain_pytorch.py) with Fabric placing
the model, optimizers and batches and running the backward.

No step is written here: the loop drives splitlab's training object (`splitlab.training.SplitTraining`),
the one the Lightning task drives, and gives it Fabric's backward. On one device Fabric trains exactly what the plain loop trains (the same weights
for the same seed: `tests/examples/test_fabric.py`); ``--accelerator cuda`` and ``--precision
bf16-mixed`` move the same loop to a GPU.

    splitlab data shapes --out data/generated/shapes
    python examples/fabric.py --data data/generated/shapes --out runs/fabric
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning.fabric import Fabric

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain_pytorch  # noqa: E402  (the example beside this one)


def main() -> None:
    parser = plain_pytorch.arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--accelerator", default="cpu", help="cpu, cuda, auto")
    parser.add_argument("--precision", default="32-true", help="Fabric's precision, e.g. bf16-mixed")
    args = parser.parse_args()
    fabric = Fabric(accelerator=args.accelerator, devices=1, precision=args.precision)
    fabric.launch()
    _, calibrated = plain_pytorch.train(
        args.data, args.out, args.warm_steps, args.ppo_steps, args.budget, fabric=fabric
    )
    print(f"saved {args.out}: mean token fraction {calibrated.after:.3f} at budget {calibrated.budget}")


if __name__ == "__main__":
    main()
