"""One shared layout against one per task: images/s for every head, the measurement in docs/reuse.md.

    python scripts/shared_layout_speed.py MULTI_RUN TASK_RUN [TASK_RUN ...] --images DIR [--batch-size 16]

MULTI_RUN is a multi-task run (`splitlab demo --task coco+ade20k`), each TASK_RUN a run of one of its
tasks (`splitlab demo --task coco`, `--task ade20k`) at the same image size. On the same batch of
``DIR``'s images, preprocessed as the multi-task model's data were: the multi-task model (one layout,
one backbone pass, every head) against the task models one after the other (a layout and a pass
each), interleaved pair by pair as `splitlab bench` times. Prints one JSON record.
"""

from __future__ import annotations

import argparse
import json

import torch

import splitlab
from splitlab.commands.bench_measures import load_images
from splitlab.metrics import interleaved, pair_spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("multi")
    parser.add_argument("tasks", nargs="+")
    parser.add_argument("--images", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--min-seconds", type=float, default=20.0)
    args = parser.parse_args()
    multi = splitlab.load(args.multi).eval()
    singles = [splitlab.load(run).eval() for run in args.tasks]
    size = multi.backbone.img_size[0]
    images = load_images(args.images, args.batch_size, multi.preprocessing, size)[0]
    device = torch.device("cpu")

    def shared() -> None:
        with torch.inference_mode():
            multi(images)

    def separate() -> None:
        with torch.inference_mode():
            for model in singles:
                model(images)

    with torch.inference_mode():
        fractions = {"shared": float(multi(images)[1].fraction.mean())}
        for run, model in zip(args.tasks, singles, strict=True):
            fractions[run] = float(model(images)[1].fraction.mean())
    t_separate, t_shared = interleaved(separate, shared, args.warmup, args.iters, device, args.min_seconds)
    done = args.batch_size * len(t_shared)
    print(
        json.dumps(
            {
                "batch_size": args.batch_size,
                "threads": torch.get_num_threads(),
                "images_per_second_shared": done / sum(t_shared),
                "images_per_second_separate": done / sum(t_separate),
                "speedup": sum(t_separate) / sum(t_shared),
                "speedup_spread": pair_spread(t_separate, t_shared),
                "token_fractions": fractions,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
