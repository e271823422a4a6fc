"""`splitlab bench`: FLOP counting, the measured keys, and clear refusals (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from splitlab.commands import TOOLS, run
from splitlab.commands.bench import BenchConfig, run_bench
from splitlab.commands.bench_table import bench_table, format_bench


def tiny_bench(**settings) -> BenchConfig:
    """The tiny test ViT at 64 px, two levels, budget 0.6, one timed pass (``settings`` on top)."""
    given = {"model": "test_vit", "img_size": 64, "batch_size": 2, "levels": (32, 16), "budget": 0.6}
    return BenchConfig(**{**given, "warmup": 1, "iters": 1, **settings})


def test_bench_reports_every_key(tmp_path) -> None:
    cfg = tiny_bench(batch_size=4)
    result = run_bench(cfg)
    for key in (
        "throughput_uniform",
        "throughput_split",
        "speedup",
        "ideal_speedup",
        "token_fraction",
        "overhead_fraction",
    ):
        assert result[key] > 0, key
    assert result["token_fraction"] == pytest.approx(0.6, abs=0.07)
    assert set(result["time_ms"]) == {"embed", "decide", "walk", "backbone", "patch_embed"}
    # the finest patch embedding (timed apart) is work the uniform forward does too: left out of the
    # overhead beyond uniform (times are not compared: one iteration of a tiny model is all noise)
    t = result["time_ms"]
    beyond = (t["embed"] - t["patch_embed"] + t["decide"] + t["walk"]) / t["backbone"]
    assert t["patch_embed"] > 0 and result["overhead_beyond_uniform_fraction"] == pytest.approx(beyond)
    assert 1.0 < result["ideal_speedup"] < 1.0 / 0.5  # fewer tokens, fewer FLOPs; attention is a part only
    # counted on CPU for both paths (whether they fault depends on the process's allocator)
    assert result["page_faults_per_batch_uniform"] >= 0 and result["page_faults_per_batch_split"] >= 0
    header, _, row = bench_table([result]).splitlines()
    assert header.count("|") == row.count("|") and row.startswith("| test_vit | 64 | 4 |")
    sweep = bench_table([{"sweep": [result, {**result, "config": {**result["config"], "batch_size": 8}}]}])
    assert [line.split("|")[3].strip() for line in sweep.splitlines()[2:]] == [
        "4",
        "8",
    ]  # a row per batch size


@pytest.mark.parametrize(
    ("model", "img_size", "grid"),
    [("test_vit3", 108, 27), ("test_vit2", 148, 37)],
    ids=["siglip-shaped-27x27", "dinov2-518-shaped-37x37"],
)
def test_bench_on_an_odd_grid_and_an_attention_pool(model, img_size, grid) -> None:
    """SigLIP-so400m/14-384 and DINOv2-518 shapes (test_vit3: no class token, SigLIP's map pool;
    test_vit2: mean pool) at 27 x 27 and 37 x 37 patches: bench calibrates and times them as any other."""
    cfg = BenchConfig(
        model=model, img_size=img_size, patch_size=4, levels=(16, 8, 4), batch_size=4, warmup=1, iters=1
    )
    result = run_bench(cfg)
    assert result["tokens_uniform"] == grid * grid
    assert result["token_fraction"] == pytest.approx(0.7, abs=0.05)
    # fewer tokens, fewer FLOPs: at most the square of the fraction's inverse (attention's share)
    assert result["speedup"] > 0 and 1.0 < result["ideal_speedup"] < 1.0 / 0.65**2


def test_bench_times_the_predict_path_on_files(tmp_path) -> None:
    """``--predict``: decoding, preprocessing, model and results on files, SPLIT against the same
    loader with timm's model; both passes see every file."""
    import numpy as np
    from PIL import Image

    for i in range(5):
        Image.fromarray(np.full((40 + 10 * i, 70, 3), 30 * i, dtype=np.uint8)).save(tmp_path / f"{i}.jpg")
    cfg = tiny_bench(warmup=0, images=str(tmp_path), predict=True, workers=0)
    result = run_bench(cfg)["predict"]
    assert result["images"] == 5 and result["speedup"] > 0 and result["share_of_backbone_speedup"] > 0
    with pytest.raises(ValueError, match="--predict times the predict path on files: give --images"):
        run_bench(BenchConfig(model="test_vit", img_size=64, predict=True))


def test_compile_gives_the_uniform_model_static_shapes_on_its_own_copy(monkeypatch) -> None:
    """``--compile``: timm's model compiled whole with static shapes (the strongest uniform baseline), on a
    copy, and SPLIT's blocks in place with dynamic shapes. Compilation itself is not run here (minutes on
    CPU): the calls are recorded and the modules run eagerly."""
    whole: list[tuple[torch.nn.Module, dict]] = []
    blocks: list[tuple[torch.nn.Module, dict]] = []

    def record_compile(module, **kwargs):
        whole.append((module, kwargs))
        return module

    monkeypatch.setattr(torch, "compile", record_compile)
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: blocks.append((self, kwargs)))
    cfg = tiny_bench(compile=True)
    result = run_bench(cfg)
    assert result["speedup"] > 0
    (uniform, kwargs), *_ = whole
    assert kwargs == {"dynamic": False} and isinstance(uniform, torch.nn.Module)
    assert [kwargs for _, kwargs in blocks] == [{"dynamic": True}] * len(uniform.blocks)
    assert not {id(block) for block, _ in blocks} & {id(block) for block in uniform.blocks}  # a copy


def test_bench_with_a_language_model_times_the_vqa_path() -> None:
    """``--lm``: ViT + projector + the LM's prefill, both paths on the same batch (a tiny random Llama)."""
    lm = '{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, '
    lm += '"num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 50}'
    cfg = tiny_bench(lm=lm)
    vqa = run_bench(cfg)["vqa"]
    assert vqa["lm_width"] == 32 and vqa["text_tokens"] > 0
    assert vqa["images_per_second_uniform"] > 0 and vqa["images_per_second_split"] > 0
    assert vqa["speedup"] == pytest.approx(vqa["images_per_second_split"] / vqa["images_per_second_uniform"])


def test_the_prefill_takes_the_language_models_dtype() -> None:
    """A hub LM loads in its own dtype (LLaVA-1.5: float16); float32 visual tokens must not break it."""
    from splitlab.commands.bench_lm import language_model, prefill

    lm = '{"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, '
    lm += '"num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 20}'
    half = language_model(lm, torch.device("cpu")).to(torch.bfloat16)
    text = half.get_input_embeddings()(torch.arange(5))
    logits = prefill(half, [torch.randn(3, 16), torch.randn(7, 16)], text)
    assert logits.shape == (2, 20) and logits.dtype == torch.bfloat16 and logits.isfinite().all()


def test_bench_command_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--model", "test_vit", "--img-size", "64", "--batch-size", "2", "--levels", "32", "16"]
    assert run([*args, "--budget", "0.5", "--iters", "1", "--warmup", "0", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["config"]["levels"] == [32, 16] and "speed-up" in capsys.readouterr().out


def test_bench_from_a_checkpoint(shapes_root, tmp_path) -> None:
    from splitlab.cli import lightning_main
    from tests.helpers import schedule_args, tiny_args

    lightning_main(
        [
            "fit",
            *tiny_args(
                shapes_root, tmp_path, *schedule_args(1, 0), "--model.init_args.evaluation.eval_baselines=[]"
            ),
        ]
    )
    result = run_bench(
        BenchConfig(
            ckpt=str(tmp_path / "checkpoints" / "last.ckpt"),
            budget=None,
            images=str(shapes_root / "val"),  # the data it was calibrated on
            batch_size=12,
            warmup=0,
            iters=1,
        )
    )
    assert result["config"]["levels"] == [32, 16, 8]
    assert result["policy_cut"] is None  # the trained policy decides, at its own budget
    # a warm start without PPO: timed as it is, and said to be what it is
    assert result["holds"].startswith("policy imitation (training stopped in its warm start")
    assert "checkpoint holds" in format_bench(result)
    assert result["token_fraction"] == pytest.approx(0.5, abs=0.1) and result["ideal_speedup"] > 1.0
    larger = run_bench(  # the checkpoint at another input size: both paths run at it
        BenchConfig(
            ckpt=str(tmp_path / "checkpoints" / "last.ckpt"), img_size=96, batch_size=2, warmup=0, iters=1
        )
    )
    assert larger["config"]["img_size"] == [96, 96] and larger["tokens_uniform"] == 144

    apt = tmp_path / "apt"  # a run that trains APT: its decision module never trained, bench refuses it
    fit_args = [
        *schedule_args(1, 0),
        "--model.init_args.evaluation.eval_baselines=[]",
        "--model.init_args.policy=entropy",
        "--model.init_args.budget_range=null",  # a fixed policy reads no budget
    ]
    lightning_main(["fit", *tiny_args(shapes_root, apt, *fit_args)])
    with pytest.raises(ValueError, match="deploys policy 'entropy'.*--budget 0.5"):
        run_bench(BenchConfig(ckpt=str(apt / "checkpoints" / "last.ckpt"), budget=None))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            BenchConfig(model="vit_nonexistent_patch16"),
            "model_name='vit_nonexistent_patch16' is not a timm model",
        ),
        (
            BenchConfig(model="test_vit", img_size=96, levels=(64, 32, 8)),
            "levels=(64, 32, 8): each level must be exactly half the previous one",
        ),
        (BenchConfig(model="test_vit", device="cuda"), "--device cuda: CUDA is not available"),
        (
            BenchConfig(model="test_vit", img_size=64, levels=(32, 16), budget=0.1),
            "--budget=0.1 is outside the range",
        ),
        (BenchConfig(model="test_vit", dtype="float8"), "--dtype float8"),
        (BenchConfig(model="test_vit", compile=True, warmup=0), "--compile with --warmup 0 would time"),
    ],
)
def test_bench_refusals(cfg, message) -> None:
    if cfg.device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_bench(cfg)


@pytest.mark.parametrize(
    ("command", "option", "dest", "given", "value", "gone"),
    [
        ("bench", "--budget", "budget", "0.5", 0.5, ["--fraction"]),
        ("curve", "--eval-budgets", "eval_budgets", "0.3,0.5", [0.3, 0.5], ["--budgets", "--fractions"]),
    ],
)
def test_the_budget_options_store_the_budget(command, option, dest, given, value, gone) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    TOOLS[command].add_parser(parser.add_subparsers(dest="command"))
    head = [command, "run"] if command == "curve" else [command]
    assert getattr(parser.parse_args(head), dest) is None  # unset: the command's own default
    assert getattr(parser.parse_args([*head, option, given]), dest) == value
    for old in gone:  # the names of before (--fraction, --fractions, curve's --budgets) are gone
        with pytest.raises(SystemExit):
            parser.parse_args([*head, old, given])


def test_a_sweep_writes_one_row_per_batch_size_with_its_spread(tmp_path, capsys) -> None:
    out = tmp_path / "sweep.json"
    args = ["bench", "--model", "test_vit", "--img-size", "64", "--levels", "32", "16", "--warmup", "0"]
    assert (
        run([*args, "--batch-sizes", "1,3", "--iters", "2", "--min-seconds", "0.05", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())["sweep"]
    assert [r["config"]["batch_size"] for r in rows] == [1, 3]
    for r in rows:
        q = r["speedup_spread"]
        assert q["pairs"] >= 2 and q["q1"] <= q["median"] <= q["q3"]
        assert r["latency_ms_per_image_split"] > 0 and r["speedup"] == pytest.approx(
            r["latency_ms_per_image_uniform"] / r["latency_ms_per_image_split"]
        )
    table = capsys.readouterr().out
    assert "| batch | backend |" in table and table.count("| test_vit") == 0 and len(table.splitlines()) == 5


def test_bench_train_times_each_stage_from_a_fit(tmp_path, capsys) -> None:
    """One fit, one epoch a stage: each stage's steps are clocked under their own stage (the
    schedule ran dense, warm start and PPO in that order), the rollouts inside PPO's step only."""
    out = tmp_path / "train.json"
    args = ["bench", "--train", "--model", "test_vit", "--img-size", "64", "--levels", "32", "16"]
    assert run([*args, "--batch-size", "2", "--iters", "2", "--warmup", "1", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["train"]
    assert result["steps_timed"] == {"dense": 2, "warm_start": 2, "ppo": 2}
    assert all(ms > 0 for ms in result["ms_per_image"].values())
    assert result["relative_to_dense"]["dense"] == 1.0
    assert 0 < result["ppo_rollout_ms_per_image"] < result["ms_per_image"]["ppo"]
    assert result["config"]["ppo_samples"] == 4 and result["config"]["levels"] == [32, 16]
    table = capsys.readouterr().out
    assert "| warm_start |" in table and "of its step" in table


def test_bench_train_refuses_what_it_does_not_time() -> None:
    with pytest.raises(ValueError, match="--train times a fresh timm classifier"):
        run(["bench", "--train", "--model", "test_vit", "--ckpt", "run/last.ckpt"])


def test_the_dense_ideal_times_timm_blocks_at_the_packed_length(tmp_path, capsys) -> None:
    """--dense-ideal: timm's blocks on a dense batch of SPLIT's mean length against the uniform
    grid's, on real tokens; the sweep shows it and the share of it."""
    out = tmp_path / "sweep.json"
    args = ["bench", "--model", "test_vit", "--img-size", "64", "--levels", "32", "16", "--warmup", "0"]
    sizes = ["--batch-sizes", "3", "--iters", "2", "--min-seconds", "0.05"]
    assert run([*args, *sizes, "--dense-ideal", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["sweep"]
    dense = row["dense_ideal"]
    uniform_tokens = 16 + 1  # a 4 x 4 grid of 16 px patches and the CLS token
    assert dense["tokens_per_image_uniform"] == uniform_tokens
    assert dense["tokens_per_image"] == round(row["tokens_split_mean"]) + 1
    assert dense["speedup"] > 0 and dense["speedup_spread"]["pairs"] >= 2
    assert row["speedup_median_over_dense_ideal"] == pytest.approx(
        row["speedup_spread"]["median"] / dense["speedup_spread"]["median"]
    )
    assert "| dense ideal | of dense ideal |" in capsys.readouterr().out
