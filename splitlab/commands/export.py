"""``splitlab export MODEL --out DIR``: a trained model in a form that runs without splitlab's trainer.

``--format hf`` (default): ``config.json`` + ``model.safetensors``, the Hugging Face layout that
``splitlab.load`` and ``SplitModel.from_pretrained`` read (and ``push_to_hub`` uploads).
``--format pt2``: a ``torch.export`` program of the deployed path with the hard cap (static shapes:
tokens padded to the cap, with a mask), loadable with ``torch.export.load`` and torch alone.
``--format onnx``: the same graph through ``torch.onnx.export(..., dynamo=True)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from splitlab.commands.arguments import add_model, device_name, fraction, positive_int

FORMATS = ("hf", "pt2", "onnx")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="save a trained model: Hugging Face layout, torch.export or ONNX")
    add_model(p)
    p.add_argument("--out", required=True, help="output folder (refused if it holds files of that format)")
    p.add_argument("--format", choices=FORMATS, default="hf")
    p.add_argument("--budget", type=fraction, default=None, help="pt2/onnx: the budget compiled in")
    p.add_argument(
        "--max-fraction", type=fraction, default=None, help="pt2/onnx: the cap the tokens are padded to"
    )
    p.add_argument("--batch-size", type=positive_int, default=2, help="pt2/onnx: the example batch")
    p.add_argument("--device", type=device_name, default="cpu")


def main(args: argparse.Namespace) -> int:
    import torch

    from splitlab.model import load

    out = Path(args.out)
    names = {"hf": ("config.json", "model.safetensors"), "pt2": ("model.pt2",), "onnx": ("model.onnx",)}
    taken = [n for n in names[args.format] if (out / n).exists()]
    if taken:
        raise FileExistsError(f"--out {out}: already holds {', '.join(taken)}; choose another --out")
    model = load(args.model, device=args.device)
    if args.format == "hf":  # what cannot be served is refused before the folder is made
        model.set_deployment(args.budget, args.max_fraction)
    else:
        model.check_call(args.budget, args.max_fraction, "learned")
    out.mkdir(parents=True, exist_ok=True)
    if args.format == "hf":
        model.save_pretrained(out)
        print(
            f"wrote {out / 'config.json'} and {out / 'model.safetensors'} (splitlab.load({str(out)!r})): {model.holds()}"
        )
        return 0
    from splitlab.model.export import StaticSplit, export_program, save_program

    size = model.backbone.img_size
    example = torch.randn(args.batch_size, 3, *size, device=args.device)
    if args.format == "pt2":
        program = export_program(model, example, args.budget, args.max_fraction)
        path = save_program(program, out / "model.pt2", model.export_config())
        print(
            f"wrote {path} (torch.export.load; inputs (B, 3, {size[0]}, {size[1]}) normalised as config says)"
        )
        return 0
    import importlib.util

    if importlib.util.find_spec("onnxscript") is None:
        raise ImportError("--format onnx needs onnx and onnxscript: pip install 'splitlab[export]'")
    static = StaticSplit(model, args.budget, args.max_fraction).eval()
    try:
        torch.onnx.export(static, (example,), str(out / "model.onnx"), dynamo=True, verbose=False)
    except Exception as err:  # an operator the ONNX exporter lacks
        if "aten.sort" in str(err):
            raise ValueError(
                "--format onnx: the hard cap ranks splits by confidence with a stable sort (aten.sort.stable), "
                "which ONNX has no function for: export to ONNX without a cap, or use --format pt2 "
                "(docs/inference.md)"
            ) from None
        raise RuntimeError(f"--format onnx: torch.onnx.export failed ({type(err).__name__})") from err
    print(f"wrote {out / 'model.onnx'}")
    return 0
