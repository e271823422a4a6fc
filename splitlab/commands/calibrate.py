"""``splitlab calibrate MODEL IMAGES... --out DIR``: a trained model re-cut to meet its budget on your images.

The deployed cut of each budget was calibrated on the training images; on images of another kind
it buys another token fraction (``splitlab predict`` says so when the mean misses the budget by more
than 0.02 and two standard errors). This re-fits the cuts on IMAGES (files or folders, as predict
reads them): the policy is unchanged, only where its logits are cut moves. Writes the model to DIR
(``save_pretrained``); ``splitlab predict DIR ...`` then meets the budget on images like IMAGES.
It says the fraction to expect on new images of that kind before you deploy: each image measured
under cuts fitted on the others (5 folds), then the cuts fitted on all of them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from splitlab.commands.arguments import add_file_reading, add_model, command_parser, file_reading, fraction

if TYPE_CHECKING:
    from splitlab.model.calibrate import Calibrated


# its line in splitlab --help
SUMMARY = "re-fit a model's budget cuts on your own images (no retraining)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "calibrate", SUMMARY, __doc__)
    add_model(p, inputs="image files or folders like those the model will see")
    p.add_argument("--out", required=True, help="folder for the calibrated model (a new one)")
    p.add_argument(
        "--budget", type=fraction, default=None, help="the budget it deploys (default: the model's)"
    )
    add_file_reading(p)


def main(args: argparse.Namespace) -> int:
    from splitlab.model import load
    from splitlab.model.calibrate import calibrate
    from splitlab.model.predict import image_files

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"--out {out}: not a new folder; give a new one (a calibrated model never replaces files)"
        )
    reading = file_reading(args)
    files = image_files(args.inputs)
    if not files:
        raise FileNotFoundError(f"inputs {args.inputs}: no image files (jpg, png, webp, bmp, tiff, ...)")
    model = load(args.model, device=args.device)
    done = calibrate(
        model,
        files,
        budget=args.budget,
        **reading,
    )
    model.save_pretrained(out)
    note = f" ({done.skipped} unreadable file(s) skipped)" if done.skipped else ""
    print(
        f"calibrated on {done.images} image(s){note}: mean token fraction at budget {done.budget:g} "
        f"{done.before:.3f} before, {done.after:.3f} now on these images; {expectation(done)}; saved {out} "
        f"({model.holds()})"
    )
    return 0


def expectation(done: Calibrated) -> str:
    """What `calibrate` expects on new images of the kind it was fitted on, in words."""
    from splitlab.model.predict import BUDGET_ERRORS, BUDGET_TOLERANCE

    if done.expected is None:
        return "too few images to estimate the fraction on new ones (give at least 2; hundreds fit best)"
    said = (
        f"on new images of this kind expect {done.expected:.3f} ± {done.expected_error:.3f} (standard error; "
        f"each image measured under cuts fitted without it, {done.folds} folds)"
    )
    spread = done.expected_error * done.images**0.5  # one image's standard deviation
    size = 500
    sample = (done.expected_error**2 + spread**2 / size) ** 0.5
    said += (
        f"; a new sample of {size} such images: its mean within {done.expected:.3f} ± {2 * sample:.3f} "
        "(two standard errors: the calibration's and the sample's)"
    )
    miss = abs(done.expected - done.budget)
    if miss > BUDGET_TOLERANCE and miss > BUDGET_ERRORS * done.expected_error:
        said += f", {miss:.3f} from the budget: calibrate on more images like these for a steadier cut"
    return said
