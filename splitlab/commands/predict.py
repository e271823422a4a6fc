"""``splitlab predict MODEL INPUT...``: a trained SPLIT model on your own image files.

MODEL is anything `splitlab.load` takes (a run folder, a ``.ckpt``, a ``save_pretrained`` folder, a
Hub id); INPUT files or folders (recursive). Writes ``predictions.jsonl`` (one line per file: its
path, the prediction with names, token count and fraction) and the task's standard file: COCO
results (detection), PNG masks at each input's size (segmentation), VQA results (VQA).

Each output is written under a ``.partial`` name and renamed when the run is whole, so a run that
fails leaves nothing an earlier prediction's check refuses: the rows it finished stay in
``predictions.jsonl.partial`` (with a warning), which the next run into that folder replaces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from splitlab.cli.runs import first_free
from splitlab.commands.arguments import (
    add_file_reading,
    add_model,
    command_parser,
    file_reading,
    fraction,
    positive_int,
)

OUTPUTS = (
    "predictions.jsonl",
    "coco_results.json",
    "image_ids.json",
    "vqa_results.json",
    "masks",
    "token_maps",
)
DIGITS = re.compile(r"(\d+)$")
PARTIAL = ".partial"  # an output being written; renamed to its own name when the run is whole


def partial(path: Path) -> Path:
    """Where ``path`` is written until the run is whole."""
    return path.with_name(path.name + PARTIAL)


def remove(path: Path) -> None:
    """Delete a file or folder this command wrote, if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# its line in splitlab --help
SUMMARY = "a trained model on image files: predictions.jsonl and the task's results file"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "predict", SUMMARY, __doc__)
    add_model(p, inputs="image files or folders (searched recursively)")
    p.add_argument("--budget", type=fraction, default=None, help="token budget (default: the model's)")
    p.add_argument(
        "--max-fraction", type=fraction, default=None, help="hard per-image cap on the token fraction"
    )
    p.add_argument(
        "--policy", default=None, help="learned | uniform | entropy | random (default: the trained one)"
    )
    p.add_argument("--out", default=None, help="output folder (default: runs/predict/<model name>[-N])")
    p.add_argument("--token-maps", action="store_true", help="also draw each image's tokens (token_maps/)")
    asked = p.add_mutually_exclusive_group()
    asked.add_argument(
        "--questions",
        default=None,
        help="VQA: a VQAv2 questions file (images matched by the id ending their file names) or "
        'a JSON {"file name": ["question", ...]}',
    )
    asked.add_argument(
        "--question", action="append", default=None, help="VQA: ask every image this (repeatable)"
    )
    p.add_argument(
        "--annotations",
        default=None,
        help="detection: a COCO annotations file whose image ids the results use",
    )
    p.add_argument("--top-k", type=positive_int, default=5, help="classification: classes per image")
    add_file_reading(p)


def output_folder(model: str, out: str | None) -> Path:
    """The folder to write into, made and checked writable before any work: ``--out`` (refused when it
    holds an earlier prediction's files), else a new ``runs/predict/<model name>[-N]``."""
    if out is None:
        stem = Path(model.rstrip("/")).stem or "model"
        if stem == "last":  # runs/x/checkpoints/last.ckpt: name it after the run
            stem = Path(model).resolve().parent.parent.name
        parent = Path("runs") / "predict"
        folder = parent / first_free(parent, re.sub(r"[^\w.-]+", "_", stem))
    else:
        folder = Path(out).expanduser()
        taken = [name for name in OUTPUTS if (folder / name).exists()]
        run = (folder / "checkpoints").is_dir() or (folder / "metrics.csv").is_file()
        if run:  # a training run's folder: its token maps and files are the training's, not a prediction's
            raise FileExistsError(
                f"--out {out}: a training run's folder (it holds {'checkpoints/' if (folder / 'checkpoints').is_dir() else 'metrics.csv'}); "
                "predictions go into a folder of their own: choose another --out (default: runs/predict/<model name>)"
            )
        if taken:
            raise FileExistsError(
                f"--out {out}: already holds {', '.join(taken)} of an earlier prediction; choose another --out"
            )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".splitlab-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise OSError(f"--out {folder}: not writable ({err.strerror or err})") from None
    return folder


def read_questions(args: argparse.Namespace, files: Sequence[Path]) -> list[list[dict[str, Any]]] | None:
    """Each file's questions (``question``, ``question_id``), from ``--question`` or ``--questions``."""
    if args.question:
        ids = iter(range(len(files) * len(args.question)))
        return [[{"question": q, "question_id": next(ids)} for q in args.question] for _ in files]
    if args.questions is None:
        return None
    path = Path(args.questions)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"--questions {path}: not a readable JSON file ({err})") from None
    if isinstance(doc, dict) and isinstance(doc.get("questions"), list):  # the official VQAv2 file
        by_image: dict[int, list[dict[str, Any]]] = {}
        for q in doc["questions"]:
            by_image.setdefault(int(q["image_id"]), []).append(
                {"question": str(q["question"]), "question_id": int(q["question_id"])}
            )
        ids = [int(m.group(1)) if (m := DIGITS.search(f.stem)) else None for f in files]
        return [by_image.get(i, []) if i is not None else [] for i in ids]
    if isinstance(doc, dict) and all(isinstance(v, list) for v in doc.values()):
        counter = iter(range(sum(len(v) for v in doc.values())))
        named = {k: [{"question": str(q), "question_id": next(counter)} for q in v] for k, v in doc.items()}
        return [named.get(f.name, named.get(str(f), [])) for f in files]
    raise ValueError(
        f"--questions {path}: expected the VQAv2 questions format or a JSON object of file name -> questions"
    )


def coco_image_ids(annotations: str | None, files: Sequence[Path]) -> dict[Path, int]:
    """Each file's COCO image id from ``--annotations`` (by file name); none without it (the files
    predicted are then numbered 1, 2, ... in input order)."""
    if annotations is None:
        return {}
    try:
        images = json.loads(Path(annotations).read_text())["images"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--annotations {annotations}: not a COCO annotations file ({err})") from None
    by_name = {Path(im["file_name"]).name: int(im["id"]) for im in images}
    missing = [f.name for f in files if f.name not in by_name]
    if missing:
        raise ValueError(
            f"--annotations {annotations}: lists no image named {missing[0]} ({len(missing)} input(s) missing)"
        )
    return {f: by_name[f.name] for f in files}


def palette_png(mask: np.ndarray) -> Image.Image:
    """A label mask as a palette PNG (16-bit grey above 256 classes)."""
    if mask.max(initial=0) > 255:
        return Image.fromarray(mask.astype(np.uint16))
    image = Image.fromarray(mask.astype(np.uint8), mode="P")
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, (256, 3), dtype=np.uint8)
    colours[0] = 0
    image.putpalette(colours.reshape(-1).tolist())
    return image


def task_models(model: Any) -> dict[str, Any]:
    """The model of each task whose results a prediction writes, by task name: a multi-task model's
    members, or the model itself under the name ``""``."""
    return getattr(model, "members", None) or {"": model}


def task_kinds(model: Any) -> set[str]:
    """The kinds of task whose results a prediction writes (a multi-task model's members')."""
    return {m.task for m in task_models(model).values()}


class Outputs:
    """What a predict run writes, file by file as predictions arrive, the results files at the end:
    all of it under `PARTIAL` names until `close` renames it (`abandon` when the run fails)."""

    def __init__(self, folder: Path, model: Any, files: Sequence[Path], args: argparse.Namespace) -> None:
        self.folder, self.model, self.task = folder, model, model.task
        for name in OUTPUTS:  # what a failed run into this folder left
            remove(partial(folder / name))
        self.lines = partial(folder / "predictions.jsonl").open("w")
        self.masks = partial(folder / "masks")
        self.token_maps = partial(folder / "token_maps") if args.token_maps else None
        self.image_ids = (
            coco_image_ids(args.annotations, files) if "detection" in task_kinds(self.model) else {}
        )
        self.coco: dict[str, list[dict[str, Any]]] = {}  # task name ("": the model's one) -> its detections
        self.vqa: list[dict[str, Any]] = []
        self.stems: dict[str, int] = {}
        self.predicted: list[Path] = []

    def unique(self, file: Path) -> str:
        """A file name stem not used before in this run (inputs from several folders may share one)."""
        seen = self.stems.get(file.stem, 0)
        self.stems[file.stem] = seen + 1
        return file.stem if seen == 0 else f"{file.stem}-{seen}"

    def add(self, file: Path, result: dict[str, Any], asked: list[dict[str, Any]] | None, extra: Any) -> None:
        record: dict[str, Any] = {"file": str(file), **result}
        stem = self.unique(file)
        self.predicted.append(file)
        if self.task == "multitask":  # each task's result under its name, written as its own task's
            for name, member in self.model.members.items():
                self.add_task(member.task, record[name], file, stem, name)
        else:
            self.add_task(self.task, record, file, stem)
        if self.task == "vqa" and asked is not None:
            for q, a in zip(asked, record["answers"], strict=True):
                a["question_id"] = q["question_id"]
                self.vqa.append({"question_id": q["question_id"], "answer": a["answer"]})
        if self.token_maps is not None and extra is not None:
            self.draw(stem, *extra)
        self.lines.write(json.dumps(record) + "\n")
        self.lines.flush()

    def add_task(self, task: str, record: dict[str, Any], file: Path, stem: str, name: str = "") -> None:
        """One task's result of one file: a segmentation mask to its PNG (``masks/<name>/`` for task
        ``name`` of a multi-task model), detections to the COCO results (``coco_results_<name>.json``)."""
        if task == "segmentation":
            mask = record.pop("mask").cpu().numpy()
            folder = self.masks / name if name else self.masks
            folder.mkdir(parents=True, exist_ok=True)
            palette_png(mask).save(folder / f"{stem}.png")
            record["mask"] = "/".join(
                ["masks", *([name] if name else []), f"{stem}.png"]
            )  # once the run is whole
        elif task == "detection":
            image_id = self.image_ids.setdefault(file, len(self.predicted))
            record["image_id"] = image_id
            masks = record.get("segmentations") or [None] * len(record["boxes"])  # Mask R-CNN's
            for box, score, category, mask in zip(
                record["boxes"], record["scores"], record["category_ids"], masks, strict=True
            ):
                x0, y0, x1, y1 = box
                entry = {
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "score": score,
                }
                self.coco.setdefault(name, []).append(
                    entry if mask is None else {**entry, "segmentation": mask}
                )

    def draw(self, stem: str, image: Any, tokens: list[list[int]]) -> None:
        from splitlab.callbacks.pictures import draw_tile

        prep = self.model.preprocessing
        scale = max(1, 256 // max(prep.shape))
        self.token_maps.mkdir(exist_ok=True)
        draw_tile(image, tokens, prep.mean, prep.std, self.model.levels.num, scale).save(
            self.token_maps / f"{stem}.png"
        )

    def close(self) -> list[str]:
        """Write the results files and give every output its own name (``predictions.jsonl`` last:
        it says the prediction is whole); their names."""
        self.lines.close()
        results: dict[str, Any] = {}
        if "detection" in task_kinds(self.model):
            names = [n for n, m in task_models(self.model).items() if m.task == "detection"]
            for name in names:
                results[f"coco_results_{name}.json" if name else "coco_results.json"] = self.coco.get(
                    name, []
                )
            results["image_ids.json"] = {str(f): self.image_ids[f] for f in self.predicted}
        if self.task == "vqa":
            results["vqa_results.json"] = sorted(self.vqa, key=lambda r: r["question_id"])
        for name, doc in results.items():
            partial(self.folder / name).write_text(
                json.dumps(doc, indent=1 if name == "image_ids.json" else None) + "\n"
            )
        folders = [f for f in (self.masks, self.token_maps) if f is not None and f.is_dir()]
        if "segmentation" in task_kinds(self.model) and not folders:  # no image was predicted: no mask either
            self.masks.mkdir()
            folders.insert(0, self.masks)
        for path in [*(partial(self.folder / name) for name in results), *folders]:
            os.replace(path, path.with_name(path.name.removesuffix(PARTIAL)))
        os.replace(partial(self.folder / "predictions.jsonl"), self.folder / "predictions.jsonl")
        return ["predictions.jsonl", *results, *(f"{f.name.removesuffix(PARTIAL)}/" for f in folders)]

    def abandon(self) -> None:
        """A run that failed: no output under its own name; the rows finished, if any, stay in
        ``predictions.jsonl.partial`` (with a warning), everything else of this run is removed."""
        import warnings

        self.lines.close()
        for name in OUTPUTS[1:]:
            remove(partial(self.folder / name))
        lines = partial(self.folder / "predictions.jsonl")
        if self.predicted:
            warnings.warn(
                f"predict stopped after {len(self.predicted)} image(s): their rows are in {lines} "
                "(not a whole prediction; the next run into this folder replaces it)",
                stacklevel=2,
            )
        else:
            lines.unlink(missing_ok=True)


def main(args: argparse.Namespace) -> int:
    import warnings

    from tqdm.auto import tqdm

    from splitlab.commands.allocator import keep_freed_memory
    from splitlab.model import load
    from splitlab.model.predict import budget_note, image_files, iter_predictions, mean_and_error

    folder = output_folder(args.model, args.out)
    files = image_files(args.inputs)
    if not files:
        raise FileNotFoundError(f"inputs {args.inputs}: no image files (jpg, png, webp, bmp, tiff, ...)")
    reading = file_reading(args)
    questions = read_questions(args, files)
    keep_freed_memory()  # on CPU each batch reuses the last one's memory instead of faulting it in again
    model = load(args.model, device=args.device)
    if (model.task == "vqa") != (questions is not None):
        need = "needs --question or --questions" if model.task == "vqa" else "asks no questions: drop them"
        raise ValueError(f"model {args.model}: a {model.task} model {need}")
    if args.annotations and "detection" not in task_kinds(model):
        raise ValueError(
            f"--annotations: only detection results use COCO image ids (this is a {model.task} model)"
        )
    if questions is not None:  # images nobody asked about have nothing to answer
        unasked = [f for f, q in zip(files, questions, strict=True) if not q]
        if unasked:
            warnings.warn(
                f"{len(unasked)} image(s) have no questions and are left out, e.g. {unasked[0]}", stacklevel=1
            )
        kept = [(f, q) for f, q in zip(files, questions, strict=True) if q]
        files, questions = [f for f, _ in kept], [q for _, q in kept]
    stream = iter_predictions(  # checks budget, cap and policy: before any output is opened
        model,
        files,
        budget=args.budget,
        max_fraction=args.max_fraction,
        policy=args.policy,
        questions=[[q["question"] for q in qs] for qs in questions] if questions is not None else None,
        top_k=args.top_k,
        keep_images=args.token_maps,
        **reading,
    )
    outputs = Outputs(folder, model, files, args)
    skipped, fractions = 0, []
    try:
        for prediction in tqdm(stream, total=len(files), desc="predict", unit="img"):
            file = files[prediction.index]
            if prediction.result is None:
                skipped += 1
                warnings.warn(f"skipping {file}: {prediction.skipped}", stacklevel=1)
                continue
            fractions.append(prediction.result["token_fraction"])
            extra = (prediction.image, prediction.layout_boxes) if args.token_maps else None
            outputs.add(file, prediction.result, questions[prediction.index] if questions else None, extra)
        if not fractions:  # abandoned below: no empty results under the outputs' names
            raise ValueError(
                f"no image could be read among the {len(files)} file(s) given ({skipped} skipped): nothing "
                "predicted; give image files (or folders that hold them)"
            )
        written = outputs.close()
    except BaseException:  # Ctrl-C included: nothing under an output's own name
        outputs.abandon()
        raise
    mean, error = mean_and_error(fractions)
    note = f", {skipped} skipped (not images)" if skipped else ""
    policy = model.check_policy(args.policy)
    budget = "" if policy == "uniform" else f" for a budget of {args.budget or model.budget:g}"
    spread = f" ± {error:.3f} (standard error)" if len(fractions) > 1 else ""
    print(
        f"predicted {len(fractions)} image(s){note}: mean token fraction {mean:.3f}{spread}{budget} "
        f"({model.holds() if policy == model.policy else f'policy {policy}'}); wrote {', '.join(written)} in {folder}"
    )
    missed = budget_note(model, fractions, args.budget, args.policy)
    if missed:
        warnings.warn(missed.replace("MODEL", args.model, 1), stacklevel=1)
    return 0
