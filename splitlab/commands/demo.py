"""``splitlab demo``: generated data -> dense backbone -> warm start + PPO -> comparison table, through
the LightningCLI and the CI twins of the recipes (`run_pipeline` is what the regression tests run too)."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from splitlab.commands import heldout
from splitlab.commands.arguments import count, lightning_overrides, seed_value
from splitlab.report import format_table

REPO = Path(__file__).resolve().parents[2]


def add_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo", help="the whole pipeline on generated data: data, backbone, warm start, PPO, table"
    )
    demo.add_argument(
        "--out", default="runs/demo", help="run directory (summary.json and token maps land here)"
    )
    demo.add_argument("--seed", type=seed_value, default=0)
    demo.add_argument("--task", choices=sorted(PIPELINES), default="classification", help="which CI twin")
    demo.add_argument(
        "--policy",
        choices=("learned", "entropy", "random", "transferred"),
        default="learned",
        help="the policy to train: SPLIT, or APT (entropy) / random fine-tuned in the same pipeline, or "
        "another run's policy (transferred, from --policy-checkpoint; docs/reuse.md)",
    )
    demo.add_argument(
        "--policy-checkpoint",
        default=None,
        help="with --policy transferred: the run whose policy this demo deploys (e.g. a demo of another task)",
    )
    demo.add_argument(
        "--background", choices=("busy", "flat"), default="busy", help="generated shapes' background"
    )
    demo.add_argument(
        "--scenes",
        choices=("twin", "circles", "triangles", "diamonds"),
        default="twin",
        help="VQA: which generated scenes (splitlab.data.generators.vqa_scenes.SCENES; docs/vqa.md)",
    )
    demo.add_argument(
        "--difficulty",
        choices=("default", "hard"),
        default="default",
        help="the twin's scenes: default, or hard (many objects, thin structures, natural textures; "
        f"tasks {', '.join(sorted(HARD_TWINS))}: configs/ci/*_hard.yaml, docs/hard_twins.md)",
    )
    demo.add_argument(
        "--reuse",
        default=None,
        help="take data and dense backbone from this earlier demo run (like for like)",
    )
    demo.add_argument(
        "--overrides-reach",
        choices=("split", "both"),
        default="split",
        help="which stages further --config / --model.* / --trainer.* / --data.* arguments reach: the SPLIT stage "
        "(default: a budget or PPO setting on the same dense backbone) or the dense stage too",
    )
    demo.add_argument(
        "--heldout",
        type=count,
        default=0,
        metavar="N",
        help="then score the run again on N validation images per class (classification) or N scenes "
        "(coco, ade20k) of its generator under a seed no twin trains on, for differences the twin's own "
        "80-150 cannot resolve (docs/loss_labels.md); rows in OUT/heldout/summary.json",
    )
    demo.epilog = (
        "Further --config FILE / --model.* / --trainer.* / --data.* arguments overlay the twin's recipe, "
        "e.g. --model.init_args.budget=0.3 (see --overrides-reach)."
    )


# CI twins: recipe, its tiny CI config, the config of the dense (backbone) stage, the data generator.
PIPELINES = {
    "classification": ("imagenet.yaml", "classification.yaml", "pretrain.yaml"),
    "coco": ("coco.yaml", "coco.yaml", "pretrain_detection.yaml"),
    "ade20k": ("ade20k.yaml", "ade20k.yaml", "pretrain_dense.yaml"),
    "vqa": ("vqav2.yaml", "vqa.yaml", "pretrain_vqa.yaml"),
    # one backbone and policy, both dense twins' heads and data (docs/reuse.md)
    "coco+ade20k": ("coco_ade20k.yaml", "coco_ade20k.yaml", "pretrain_multitask.yaml"),
}
MULTITASK = {"coco+ade20k": ("coco", "ade20k")}  # a multi-task twin's tasks: each its own twin's data
# a twin's hard twin: the configs/ci/ overlay on top of the twin, read by both stages, and HARD_DENSE
# after the dense stage's config (docs/hard_twins.md)
HARD_DENSE = "pretrain_hard.yaml"
HARD_TWINS = {
    "classification": "classification_hard.yaml",
    "coco": "coco_hard.yaml",
    "ade20k": "ade20k_hard.yaml",
}


# VQA scenes (splitlab.data.generators.vqa_scenes.SCENES) that the twin's training does not learn: configs/ci/
# files added to both stages and to the dense stage only (docs/vqa.md, "Other scenes")
VQA_SCENES_CONFIGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "triangles": (("vqa_wide_lm.yaml",), ("vqa_long_dense.yaml",)),
    "diamonds": (("vqa_wide_lm.yaml",), ("vqa_long_dense.yaml",)),
}


def scenes_configs(scenes: str) -> tuple[list[str], list[str]]:
    """``--config`` arguments the VQA ``scenes`` add to both stages, and to the dense stage only."""
    both, dense = VQA_SCENES_CONFIGS.get(scenes, ((), ()))
    folder = REPO / "configs" / "ci"
    return (
        [a for name in both for a in ("--config", str(folder / name))],
        [a for name in dense for a in ("--config", str(folder / name))],
    )


def ci_recipe(task: str = "classification", difficulty: str = "default") -> list[str]:
    """``--config`` arguments of a recipe and its CI twin (paths inside this checkout), and of the
    twin's hard overlay with ``difficulty="hard"``."""
    recipe, twin, _ = PIPELINES[task]
    paths = [REPO / "tasks" / recipe, REPO / "configs" / "ci" / twin]
    if difficulty != "default":
        check_difficulty(task, difficulty)
        paths.append(REPO / "configs" / "ci" / HARD_TWINS[task])
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run the demo from a splitlab checkout")
    return [a for path in paths for a in ("--config", str(path))]


def check_difficulty(task: str, difficulty: str) -> None:
    """Hard scenes exist for the twins of `HARD_TWINS` only."""
    if difficulty not in ("default", "hard"):
        raise ValueError(f"difficulty={difficulty!r}: expected default or hard")
    if difficulty == "hard" and task not in HARD_TWINS:
        raise ValueError(
            f"--difficulty hard: no hard twin of --task {task} (only {', '.join(sorted(HARD_TWINS))})"
        )


def data_record(
    task: str, seed: int, background: str, scenes: str, difficulty: str, heldout_count: int = 0
) -> dict[str, Any]:
    """What a generated dataset was made with, as its ``.complete`` marker records it."""
    made: dict[str, Any] = {"task": task, "seed": seed, "background": background}
    if difficulty != "default":
        made["difficulty"] = difficulty
    if task == "vqa":
        made["scenes"] = scenes
    if heldout_count:
        made["count"] = heldout_count
    return made


def generate_for(
    task: str,
    out: Path,
    seed: int,
    background: str = "busy",
    scenes: str = "twin",
    difficulty: str = "default",
    heldout_count: int = 0,
) -> None:
    """The generated dataset a CI twin reads (for VQA, the ``scenes`` configuration of `SCENES`; with
    ``difficulty="hard"`` the hard twin's scenes, 300 training and 80 validation images per class
    for classification). With ``heldout_count`` its held-out set instead (`splitlab.commands.heldout`):
    that many validation images per class (scenes), one training and test image per class."""
    from splitlab.data import generate_ade20k, generate_coco, generate_shapes

    heldout.check_heldout(task, heldout_count)
    hard = {"difficulty": difficulty} if difficulty != "default" else {}
    sizes = {"train": 1, "val": heldout_count} if heldout_count else {"train": 300, "val": 80}
    shapes = {**sizes, "test": 1 if heldout_count else 80}
    if task in MULTITASK:  # each task's data as its own twin generates it, in a folder of its name
        for part in MULTITASK[task]:
            generate_for(part, out / part, seed)
    elif task == "classification" and hard:
        generate_shapes(out, **shapes, seed=seed, **hard)
    elif task == "classification":  # the default twin: the generator's own sizes
        generate_shapes(out, seed=seed, background=background, **(shapes if heldout_count else {}))
    elif task == "coco":
        generate_coco(out, **sizes, seed=seed, **hard)
    elif task == "vqa":
        from splitlab.data import generate_vqa
        from splitlab.data.generators.vqa_scenes import SCENES

        if scenes not in SCENES:
            raise ValueError(f"scenes={scenes!r}: expected one of {', '.join(SCENES)}")
        generate_vqa(out, seed=seed, **SCENES[scenes])
    else:
        generate_ade20k(out, **sizes, seed=seed, **hard)
    made = data_record(task, seed, background, scenes, difficulty, heldout_count)
    (out / ".complete").write_text(json.dumps(made))


def generate_heldout(
    folder: Path, task: str, count: int, seed: int, background: str = "busy", difficulty: str = "default"
) -> Path:
    """The held-out set of a twin whose data was made with ``seed``: `generate_for` under seed
    ``HELDOUT_SEED + seed`` with ``count`` validation images per class (scenes); kept where ``folder``
    holds a finished set of the same settings, made again otherwise."""
    held = heldout.HELDOUT_SEED + seed
    marker = folder / ".complete"
    wanted = data_record(task, held, background, "twin", difficulty, count)
    if marker.exists() and json.loads(marker.read_text() or "{}") == wanted:
        return folder
    clear(folder.parent, [folder.name])  # an unfinished set, or one of other settings: this demo's own
    generate_for(task, folder, held, background, difficulty=difficulty, heldout_count=count)
    return folder


def data_root_args(task: str, data: Path) -> list[str]:
    """The setting that points the twin at the generated data: its ``root``; a multi-task twin's data
    modules, each at its task's folder (the twin's data section with the roots replaced)."""
    if task not in MULTITASK:
        return [f"--data.init_args.root={data}"]
    import yaml

    twin = yaml.safe_load((REPO / "configs" / "ci" / PIPELINES[task][1]).read_text())
    modules = twin["data"]["init_args"]["task_data"]
    for name in MULTITASK[task]:
        modules[name]["init_args"]["root"] = str(data / name)
    return [f"--data.init_args.task_data={json.dumps(modules)}"]


def check_reused(data: Path, wanted: dict[str, Any], flag: str) -> None:
    """Refuse to reuse generated data (and its dense backbone) made for other settings, which would
    silently run the demo asked for on the wrong data."""
    text = (data / ".complete").read_text().strip()
    made = json.loads(text) if text else {}  # older runs recorded nothing
    if made:  # data made before --difficulty was the default's
        made.setdefault("difficulty", "default")
    differ = {k: (made[k], v) for k, v in wanted.items() if k in made and made[k] != v}
    if differ:
        was = ", ".join(f"--{k} {a}" for k, (a, _) in differ.items())
        now = ", ".join(f"--{k} {b}" for k, (_, b) in differ.items())
        raise ValueError(
            f"{flag} {data.parent}: its data and dense backbone were made with {was}, not {now}; "
            "give another --out (or --reuse a run made with these settings)"
        )


MARKER = ".splitlab-demo.json"  # what a demo folder was made for: task, seed, background, policy
# the SPLIT stage's files (and the held-out scores of the run it replaces)
FIT_OUTPUTS = (
    "metrics.csv",
    "hparams.yaml",
    "summary.json",
    "config.yaml",
    "checkpoints",
    "token_maps",
    heldout.SCORES,
)


def claim_out(out: Path, wanted: dict[str, Any]) -> None:
    """Make ``out`` this demo's folder: refuse one that splitlab demo did not make (a fit's folder,
    anything else) or made for another policy, naming what is there; record what it is for."""
    marker = out / MARKER
    if marker.exists():
        made = json.loads(marker.read_text() or "{}")
    elif (out / "data" / ".complete").exists():  # made before the marker: its summary names the policy
        summary = out / "summary.json"
        trained = json.loads(summary.read_text()).get("trained_policy") if summary.exists() else None
        made = {"policy": trained or "learned"}
    elif out.exists() and any(out.iterdir()):
        there = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        raise FileExistsError(
            f"--out {out}: holds files splitlab demo did not make ({there}); give another --out "
            "(a demo writes only into a new folder or one of its own)"
        )
    else:
        made = {}
    if made.get("policy", wanted["policy"]) != wanted["policy"]:
        raise ValueError(
            f"--out {out}: a demo of --policy {made['policy']} lives there, not --policy {wanted['policy']}; "
            f"give another --out (--reuse {out} shares its data and dense backbone)"
        )
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(wanted) + "\n")


def clear(folder: Path, names: Sequence[str]) -> None:
    """Remove this demo's own earlier outputs before it writes them again (never a file it did not make)."""
    for name in names:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def policy_args(policy: str) -> list[str]:
    """Settings that make ``policy`` the trained one (a fixed policy has no budgets to condition on)."""
    if policy == "learned":
        return []
    return [
        f"--model.init_args.policy={policy}",
        "--model.init_args.budget_range=null",
        "--model.init_args.evaluation.eval_budgets=[]",
    ]


def run_pipeline(
    out: str | Path,
    seed: int = 0,
    extra: Sequence[str] = (),
    quiet: bool = False,
    task: str = "classification",
    policy: str = "learned",
    background: str = "busy",
    reuse: str | Path | None = None,
    scenes: str = "twin",
    difficulty: str = "default",
    split_only: Sequence[str] = (),
) -> dict:
    """Generated data -> dense backbone -> warm start + PPO, all through the LightningCLI.

    Returns the run's summary record (also in ``<out>/summary.json``). Finished steps (data, the
    dense backbone) are reused when ``out`` already holds them, or taken from the run ``reuse``
    (so that SPLIT and APT start from the same data and backbone). ``scenes`` picks the VQA data
    (`splitlab.data.generators.vqa_scenes.SCENES`), ``difficulty`` the twin (``hard``: the hard twin,
    its data and its `HARD_TWINS` overlay). ``extra`` reaches both stages; ``split_only`` (after it)
    the SPLIT stage alone: an overlay that restates the stage schedule (``trainer.callbacks``,
    ``max_epochs``, as configs/ci/classification_unannotated.yaml does) would otherwise replace the
    dense stage's, and the backbone would not be trained as the twin's.
    """
    if task not in PIPELINES:
        raise ValueError(f"task={task!r}: expected one of {sorted(PIPELINES)}")
    check_difficulty(task, difficulty)
    out = Path(out)
    source = Path(reuse) if reuse is not None else out
    data = prepare_data(out, source, reuse, task, seed, policy, background, scenes, difficulty)
    extra = [*policy_args(policy), *extra]
    # overrides follow every --config, so the dense stage's config cannot reset them
    overrides = [
        *data_root_args(task, data),
        *([f"--model.init_args.lm_tokenizer={data / 'vocab.json'}"] if task == "vqa" else []),
        f"--seed_everything={seed}",
        f"--model.init_args.policy_options.sampling_seed={seed}",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.logger.init_args.name=",
    ]
    if quiet:
        overrides += ["--trainer.enable_progress_bar=false"]
    both = scenes_configs(scenes)[0] if task == "vqa" else []
    pretrain = dense_backbone(source, reuse, task, scenes, overrides, extra, difficulty)
    clear(out, FIT_OUTPUTS)  # this demo's earlier SPLIT stage, if any: the new one replaces it
    version = "--trainer.logger.init_args.version="
    fit(
        [
            "fit",
            *ci_recipe(task, difficulty),
            *both,
            *overrides,
            version,
            f"--model.init_args.init_checkpoint={pretrain}",
            *extra,
            *split_only,
        ]
    )
    return json.loads((out / "summary.json").read_text())


def fit(args: list[str]) -> None:
    """One ``lightning fit`` of a stage; a stage stopped by a signal (Ctrl-C, SIGTERM) is unfinished,
    so is the demo: it exits with the signal's code."""
    from splitlab.cli import lightning_main, stop_code

    code = stop_code(lightning_main(args))
    if code:
        raise SystemExit(code)


def prepare_data(
    out: Path,
    source: Path,
    reuse: str | Path | None,
    task: str,
    seed: int,
    policy: str,
    background: str,
    scenes: str,
    difficulty: str = "default",
) -> Path:
    """The demo's data folder: generated in ``out``, or found finished in ``source`` (``reuse``'s run,
    or an earlier demo in ``out``) and checked to have been made for these settings; ``out`` is
    claimed for this demo first."""
    data = source / "data"
    made = not (data / ".complete").exists()
    if made and reuse is not None:
        raise FileNotFoundError(f"--reuse {reuse}: no finished demo run there (no data/.complete)")
    # the background shapes the classification data only, the scenes the VQA data only
    shaped = {"classification": {"background": background}, "vqa": {"scenes": scenes}}.get(task, {})
    shaped["difficulty"] = difficulty
    if not made and reuse is not None:  # the comparison: that run's data and backbone, another policy or seed
        vqa = {"scenes": scenes} if task == "vqa" else {}
        check_reused(data, {"task": task, "difficulty": difficulty, **vqa}, "--reuse")
    elif not made:
        check_reused(data, {"task": task, "seed": seed, **shaped}, "--out")
    hard = {"difficulty": difficulty} if difficulty != "default" else {}
    claim_out(out, {"task": task, "seed": seed, "background": background, "policy": policy, **hard})
    if made:
        generate_for(task, data, seed, background, scenes, difficulty)
    return data


def dense_backbone(
    source: Path,
    reuse: str | Path | None,
    task: str,
    scenes: str,
    overrides: Sequence[str],
    extra: Sequence[str],
    difficulty: str = "default",
) -> Path:
    """The dense stage's checkpoint: ``source``'s finished one, or trained now (from the start, an
    unfinished one's files cleared) with the demo's ``overrides`` and ``extra`` after the dense configs."""
    pretrain = source / "pretrain" / "checkpoints" / "last.ckpt"
    finished = source / "pretrain" / ".complete"  # last.ckpt alone may be an interrupted stage's
    if finished.exists():
        return pretrain
    if reuse is not None:
        raise FileNotFoundError(f"--reuse {reuse}: no finished dense backbone there ({finished})")
    clear(source, ["pretrain"])
    both, dense_only = scenes_configs(scenes) if task == "vqa" else ([], [])
    dense = REPO / "configs" / "ci" / PIPELINES[task][2]
    version = "--trainer.logger.init_args.version=pretrain"
    recipe = ci_recipe(task, difficulty)
    if difficulty == "hard":
        dense_only = [*dense_only, "--config", str(REPO / "configs" / "ci" / HARD_DENSE)]
    fit(["fit", *recipe, *both, "--config", str(dense), *dense_only, *overrides, version, *extra])
    finished.parent.mkdir(parents=True, exist_ok=True)
    finished.write_text("")
    return pretrain


def main(args: argparse.Namespace, overrides: Sequence[str] = ()) -> int:
    if (args.policy == "transferred") != bool(args.policy_checkpoint):
        raise ValueError(
            "--policy transferred and --policy-checkpoint RUN go together: the policy comes from that run"
        )
    given = lightning_overrides(
        overrides, ("--config", "--data.", "--model.", "--trainer.")
    )  # --seed: the demo's
    extra = (
        [f"--model.init_args.policy_options.policy_checkpoint={args.policy_checkpoint}"]
        if args.policy_checkpoint
        else []
    )
    heldout.check_heldout(args.task, args.heldout)
    both = args.overrides_reach == "both" and bool(given)
    trained = Path(args.reuse or args.out) / "pretrain" / ".complete"
    if both and trained.exists():  # a finished dense stage is reused as it was trained
        raise ValueError(
            f"--overrides-reach both: {trained.parent} holds a finished dense backbone, which this demo "
            "would reuse as it was trained; give a new --out (and no --reuse), or let the overrides "
            "reach the SPLIT stage only"
        )
    record = run_pipeline(
        args.out,
        args.seed,
        extra=[*extra, *given] if both else extra,
        split_only=[] if both else given,
        task=args.task,
        policy=args.policy,
        background=args.background,
        reuse=args.reuse,
        scenes=args.scenes,
        difficulty=args.difficulty,
    )
    print("\n" + format_table(record))
    print(f"\nsummary: {Path(args.out) / 'summary.json'}   token maps: {Path(args.out) / 'token_maps'}")
    if args.heldout:
        scored = score_heldout(Path(args.out), Path(args.reuse or args.out), args.task, args.heldout)
        print("\n" + format_table(scored))
        print(f"\nheld-out summary: {Path(args.out) / heldout.SCORES / 'summary.json'}")
    return 0


def score_heldout(out: Path, source: Path, task: str, number: int) -> dict:
    """The finished run in ``out`` validated on ``number`` more images per class (scenes) of its data's
    generator, seed and settings (``source``: the run whose data it trained on; `splitlab.commands.heldout`)."""
    made = json.loads((source / "data" / ".complete").read_text() or "{}")
    data = generate_heldout(
        out / heldout.DATA,
        task,
        number,
        int(made.get("seed", 0)),
        made.get("background", "busy"),
        made.get("difficulty", "default"),
    )
    clear(out, [heldout.SCORES])
    fit(heldout.validate_args(out, data))
    return heldout.read_record(out, data)
