"""The VQA twin end to end: `lightning fit --config tasks/vqav2.yaml --config configs/ci/vqa.yaml` after a
dense stage, on generated scenes in the official VQAv2 layout, then predict from the checkpoint (the
official results file), on one rank and on two.

The twin's data (`generate_for`): one patterned square per scene, the pattern question plus one coarse
question per image, so its from-scratch 2-layer LM learns to read the pattern within the dense stage
(docs/vqa.md). Measured over seeds 0-2 on its 450 validation images (docs/vqa.md): learned - random
+0.097 / +0.107 / +0.116 overall, +0.22 / +0.22 / +0.22 on the pattern question; learned - uniform
-0.007 / -0.012 / -0.018.

So that passing does not rest on the one generator configuration the twin was built around, the slow
sweep (`test_the_vqa_twin_reads_fine_detail_on_scenes_it_was_not_built_around`) trains and checks the
same pipeline on `SCENES` "circles", "diamonds" and "triangles" (other shapes, five or six patterns with
orientation-only pairs, 2-4 objects, flat or noise backgrounds; docs/vqa.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from splitlab.cli import lightning_main
from splitlab.commands.demo import run_pipeline
from splitlab.data.generators.vqa_scenes import SCENES
from tests.helpers import TWO_CPU_RANKS, launch, one_point_curve, schedule_args, twin_configs

KINDS = ("vqa_q_what_pattern", "vqa_q_what_color", "vqa_q_is_there", "vqa_q_how_many")


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("vqa") / "run"
    return out, run_pipeline(out, seed=0, quiet=True, task="vqa")


def test_the_vqa_twin_meets_its_budget_and_reports_every_accuracy(vqa_run, measured) -> None:
    _, record = vqa_run
    rows = record["policies"]
    measured(  # the numbers belong in the CI log
        "vqa CI: "
        + ", ".join(
            f"{k} {v['metric']:.3f} (pattern {v['vqa_q_what_pattern']:.3f}) @ {v['token_fraction_mean']:.3f}"
            for k, v in rows.items()
        )
    )
    assert record["task"] == "vqa" and record["metric"] == "vqa_accuracy"
    assert set(rows) == {"learned", "uniform", "random", "entropy", "loss_oracle"}  # no annotations, a loss
    assert abs(rows["learned"]["token_fraction_mean"] - record["budget"]) <= 0.03
    for row in rows.values():
        assert {"vqa_yes_no", "vqa_number", "vqa_other", *KINDS} <= set(row)
        assert row["metric"] == pytest.approx(row["vqa_accuracy"])
    assert rows["uniform"]["token_fraction_mean"] == 1.0


def test_the_learned_policy_reads_the_fine_detail_at_half_the_tokens(vqa_run) -> None:
    """The fine-detail question drives the ordering: the learned policy puts fine tokens on the
    patterned square, random and entropy (busy background) often leave it coarse."""
    rows = vqa_run[1]["policies"]
    learned, uniform, random, entropy = (rows[k] for k in ("learned", "uniform", "random", "entropy"))
    assert abs(random["token_fraction_mean"] - learned["token_fraction_mean"]) <= 0.05  # matched fraction
    pattern = "vqa_q_what_pattern"
    assert uniform[pattern] >= 0.9  # the dense model reads the pattern: the question tests the tokens
    assert learned[pattern] >= random[pattern] + 0.10
    assert learned[pattern] >= entropy[pattern] + 0.20
    assert learned["metric"] >= random["metric"] + 0.05
    assert learned["metric"] >= uniform["metric"] - 0.05


def test_curve_of_the_vqa_run(vqa_run, tmp_path) -> None:
    """`splitlab curve` on the VQA run (trained for one budget: its one point)."""
    out, record = vqa_run
    one_point_curve(out, tmp_path / "curve", record, tolerance=1e-4)


def test_predict_from_the_checkpoint_writes_the_answers_validation_scored(vqa_run, tmp_path) -> None:
    """`lightning predict` from the checkpoint on questions without annotations (as for test-dev): the
    official results file, every question once, scoring what the fit's validation scored (`validate`
    and `test` reruns: the dense twins)."""
    out, record = vqa_run
    data = Path(shutil.copytree(out / "data", tmp_path / "questions-only"))
    (data / "v2_mscoco_val2014_annotations.json").unlink()
    args = [
        *twin_configs("vqa"),
        f"--data.init_args.root={data}",
        f"--model.init_args.lm_tokenizer={out / 'data' / 'vocab.json'}",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    lightning_main(["predict", *args, f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"])
    results = json.loads((tmp_path / "vqa_results.json").read_text())
    questions = json.loads((out / "data" / "v2_OpenEnded_mscoco_val2014_questions.json").read_text())[
        "questions"
    ]
    assert sorted(r["question_id"] for r in results) == sorted(q["question_id"] for q in questions)
    assert all(set(r) == {"question_id", "answer"} and isinstance(r["answer"], str) for r in results)
    # scored against the annotations held back, the written answers are the validation's answers
    from splitlab.metrics import vqa_score

    path = out / "data" / "v2_mscoco_val2014_annotations.json"
    humans = {
        a["question_id"]: [h["answer"] for h in a["answers"]]
        for a in json.loads(path.read_text())["annotations"]
    }
    score = sum(vqa_score(r["answer"], humans[r["question_id"]]) for r in results) / len(results)
    assert score == pytest.approx(record["policies"]["learned"]["metric"], abs=1e-4)


def test_a_siglip_shaped_tower_trains_through_both_stages(tmp_path) -> None:
    """The VQA twin once with a tiny SigLIP-shaped tower (configs/towers/siglip_so400m.yaml's shape: no
    class token, an attention-pool head the LM never reads, and an odd patch grid, 27 x 27 here): warm
    start and PPO run, the budget is met, and on the uniform layout the LM receives the tower's own
    tokens of the chosen block, in timm's raster order."""
    import torch

    import splitlab
    from splitlab.data import generate_vqa
    from splitlab.data.generators.vqa_scenes import SCENES

    scenes = {**SCENES["twin"], "train": 48, "val": 16}
    root = generate_vqa(tmp_path / "data", seed=0, **scenes)
    out = tmp_path / "run"
    lightning_main(
        [
            "fit",
            *twin_configs("vqa"),
            f"--data.init_args.root={root}",
            f"--model.init_args.lm_tokenizer={root / 'vocab.json'}",
            "--model.init_args.backbone=vit_base_patch16_siglip_224",
            '--model.init_args.backbone_kwargs={"img_size": 54, "patch_size": 2, "embed_dim": 32, "depth": 2, "num_heads": 2}',
            "--model.init_args.tokenizer.levels=[8,4,2]",
            "--model.init_args.tokenizer.decision_dim=16",
            "--model.init_args.tokenizer.decision_heads=2",
            "--model.init_args.evaluation.eval_baselines=[uniform]",
            "--model.init_args.ppo.samples=2",
            "--model.init_args.ppo.epochs=1",
            "--data.init_args.batch_size=8",
            *schedule_args(warm=1, rl=1),
            f"--trainer.logger.init_args.save_dir={out}",
            "--trainer.logger.init_args.name=",
            "--trainer.logger.init_args.version=",
            "--trainer.enable_progress_bar=false",
        ]
    )
    record = json.loads((out / "summary.json").read_text())
    assert record["trained_policy"] == "learned"  # PPO ran (a policy it never trained says imitation)
    assert abs(record["policies"]["learned"]["token_fraction_mean"] - record["budget"]) <= 0.03
    model = splitlab.load(out).eval()
    vit = model.backbone.model
    assert (
        vit.attn_pool is not None and vit.cls_token is None and tuple(vit.patch_embed.grid_size) == (27, 27)
    )
    images = torch.randn(2, 3, 54, 54)
    with torch.no_grad():
        visual, layout = model(images, policy="uniform")
        block = model.backbone_indices()[0]
        _, dense = vit.forward_intermediates(images, indices=[block], norm=False, output_fmt="NLC")
        reference = model.head.projector(dense[0])
    assert layout.seqlens == [729, 729]
    for mine, theirs in zip(visual, reference, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)


@pytest.mark.distributed
def test_predict_on_two_ranks_writes_one_results_file(tmp_path) -> None:
    """DDP predict (2 CPU ranks over gloo) with the twin's model: rank 0 gathers every rank's answers into
    one official file, each question once, from 7 images the ranks share 4 + 3. Untrained weights do:
    which answers is not the question here, whose and how many (the checkpoint's: the one-rank test)."""
    from splitlab.data import generate_vqa

    root = generate_vqa(tmp_path / "data", img_size=64, train=4, val=7, seed=0)
    launch(
        [
            "predict",
            *twin_configs("vqa"),
            f"--data.init_args.root={root}",
            f"--model.init_args.lm_tokenizer={root / 'vocab.json'}",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path / 'out'}",
            "--trainer.enable_progress_bar=false",
            *TWO_CPU_RANKS,
        ]
    )
    results = json.loads((tmp_path / "out" / "vqa_results.json").read_text())
    questions = json.loads((root / "v2_OpenEnded_mscoco_val2014_questions.json").read_text())["questions"]
    assert len({q["image_id"] for q in questions}) == 7
    assert [r["question_id"] for r in results] == sorted(q["question_id"] for q in questions)
    assert not list((tmp_path / "out").glob("vqa_results.rank*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_the_vqa_twin_meets_its_budget_across_seeds(tmp_path, seed, measured) -> None:
    """The budget within ±0.03 on every seed (docs/budgets.md), and the fine-detail ordering with it."""
    record = run_pipeline(tmp_path / "run", seed=seed, quiet=True, task="vqa")
    rows = record["policies"]
    learned, random = rows["learned"], rows["random"]
    measured(  # the numbers belong in the CI log
        f"vqa seed {seed}: learned {learned['metric']:.3f} (pattern {learned['vqa_q_what_pattern']:.3f}) "
        f"at {learned['token_fraction_mean']:.3f}; random {random['metric']:.3f} "
        f"(pattern {random['vqa_q_what_pattern']:.3f})"
    )
    assert abs(learned["token_fraction_mean"] - record["budget"]) <= 0.03
    assert learned["vqa_q_what_pattern"] >= random["vqa_q_what_pattern"] + 0.10


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenes",
    [
        "circles",
        "diamonds",  # with the 24-epoch dense stage and 128-wide LM found for triangles
        pytest.param(  # the threshold stands; the run misses it (docs/vqa.md, "Other scenes")
            "triangles",
            marks=pytest.mark.xfail(  # strict: an XPASS fails, so the marker goes when it passes
                reason="measured 2026-12-02 with a 128-wide LM and 24 dense epochs: uniform reads the "
                "pattern at 0.841 (0.880 after the dense stage), not 0.9; learned - random +0.059. "
                "Also tried (dense stage, pattern): flat background 0.965; pattern question only 0.423; "
                "3600 images 0.227; 3 coarse questions + 3 LM layers 0.258; 3 LM layers 0.781; "
                "3600 images and 24 epochs (3x the steps) 0.348 at epoch 13 of 24 (0.319 at 12), stopped",
                strict=True,
            ),
        ),
    ],
)
def test_the_vqa_twin_reads_fine_detail_on_scenes_it_was_not_built_around(tmp_path, scenes, measured) -> None:
    """The twin's pipeline, unchanged, on generator configurations other than its own (train and
    evaluate on each): the dense model reads the fine pattern and the learned policy keeps it at half
    the tokens where random does not. Entropy is not held to a margin: on a flat background the
    patterned object is the one busy region, so entropy is the right cue there (docs/vqa.md)."""
    record = run_pipeline(tmp_path / "run", seed=0, quiet=True, task="vqa", scenes=scenes)
    meta = json.loads((tmp_path / "run" / "data" / "splitlab_dataset.json").read_text())
    assert meta["shape"] == SCENES[scenes]["shape"]
    rows = record["policies"]
    pattern = "vqa_q_what_pattern"
    measured(  # the numbers belong in the CI log
        f"vqa {scenes}: "
        + ", ".join(
            f"{k} {v['metric']:.3f} (pattern {v[pattern]:.3f}) @ {v['token_fraction_mean']:.3f}"
            for k, v in rows.items()
        )
    )
    learned, uniform, random = rows["learned"], rows["uniform"], rows["random"]
    assert abs(learned["token_fraction_mean"] - record["budget"]) <= 0.03
    assert abs(random["token_fraction_mean"] - learned["token_fraction_mean"]) <= 0.05  # matched fraction
    assert uniform[pattern] >= 0.9
    assert learned[pattern] >= random[pattern] + 0.10
