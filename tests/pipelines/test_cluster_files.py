"""SLURM scripts and the Docker image: syntax, lint, and that the scripts ask SLURM for what they tell Lightning."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).parents[2]
SCRIPTS = sorted((REPO / "configs" / "slurm").glob("*.sbatch"))
GPU_CHECK = REPO / "scripts" / "gpu-check.sh"
SLURM_LOCAL = REPO / "scripts" / "slurm-local.sh"
BIN = Path(sys.executable).parent


def tool(name: str) -> str | None:
    return shutil.which(name, path=f"{BIN}:{shutil.os.environ.get('PATH', '')}")


def sbatch(script: Path, key: str) -> str:
    match = re.search(rf"^#SBATCH --{key}=(\S+)", script.read_text(), re.M)
    assert match, f"{script.name}: no #SBATCH --{key}"
    return match.group(1)


def variable(script: Path, name: str) -> str:
    """A variable's value, or its default when it is read from SLURM's environment (``${X:-8}``)."""
    match = re.search(rf"^{name}=(\S+)", script.read_text(), re.M)
    assert match, f"{script.name}: no {name}="
    value = match.group(1)
    default = re.fullmatch(r"\$\{SLURM_\w+:-(\d+)\}", value)
    return default.group(1) if default else value


def test_there_are_one_and_multi_node_scripts() -> None:
    assert {s.name for s in SCRIPTS} >= {"one_node.sbatch", "multi_node.sbatch"}
    assert int(sbatch(REPO / "configs" / "slurm" / "multi_node.sbatch", "nodes")) > 1


@pytest.mark.parametrize("script", [*SCRIPTS, GPU_CHECK, SLURM_LOCAL], ids=lambda p: p.name)
def test_bash_syntax(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", [*SCRIPTS, GPU_CHECK, SLURM_LOCAL], ids=lambda p: p.name)
def test_shellcheck(script: Path) -> None:
    if tool("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    done = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_nodes_and_tasks_match_the_trainer(script: Path) -> None:
    text = script.read_text()
    nodes, per_node = int(sbatch(script, "nodes")), int(sbatch(script, "ntasks-per-node"))
    assert int(variable(script, "NODES")) == nodes
    assert int(variable(script, "GPUS_PER_NODE")) == per_node == int(sbatch(script, "gpus-per-node"))
    assert '--trainer.num_nodes="$NODES"' in text and '--trainer.devices="$GPUS_PER_NODE"' in text
    assert "#SBATCH --signal=SIGUSR1@90" in text and "srun" in text and "lightning fit" in text
    assert "--config configs/trainer/slurm.yaml" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_check_without_a_gpu_stops_at_once_with_a_clear_message(tmp_path) -> None:
    env = {**shutil.os.environ, "GPU_CHECK_PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(GPU_CHECK)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert (
        done.stderr.startswith("gpu-check: no CUDA device is visible to torch")
        and "Traceback" not in done.stderr
    )
    assert not list((tmp_path / "out").glob("*.json"))


def test_gpu_check_bench_steps_parse_as_bench_arguments(tmp_path) -> None:
    """Every bench step of ``make gpu-check`` is a valid ``splitlab bench`` command line: a typo would
    otherwise show only on a GPU machine, lent for minutes."""
    import argparse
    import shlex

    from splitlab.commands import bench

    text = GPU_CHECK.read_text()
    arrays = {name: shlex.split(body) for name, body in re.findall(r"^(\w+)=\((.*)\)$", text, re.M)}
    common = re.search(r"-m splitlab bench (.*?) \\\n", text)
    steps = re.findall(r"^\s*bench (\S+) \d+ (.*)$", text, re.M)
    assert common and len(steps) >= 9, "the bench() helper or its steps moved: update this test"
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    for name, rest in steps:
        argv = []
        for word in shlex.split(rest):
            array = re.fullmatch(r"\$\{(\w+)\[@\]\}", word)
            argv += arrays[array.group(1)] if array else [word]
        args = parser.parse_args(
            ["bench", *shlex.split(common.group(1)), "--json", str(tmp_path / "b.json"), *argv]
        )
        assert args.device == "cuda" and args.iters >= 1, name
        if "sweep" in name:
            assert args.batch_sizes and 1 in args.batch_sizes, name


@pytest.mark.parametrize("recipe", sorted((REPO / "tasks").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_checkpoints_each_epoch(recipe: Path) -> None:
    """A step trigger would turn the epoch saves off and leave last.ckpt at the last multiple of N
    steps, not the final model (Lightning's triggers are mutually exclusive)."""
    callbacks = yaml.safe_load(recipe.read_text())["trainer"]["callbacks"]
    saving = [c.get("init_args", {}) for c in callbacks if c["class_path"].endswith("ModelCheckpoint")]
    assert any(
        args.get("save_last") and not args.get("every_n_train_steps") and not args.get("train_time_interval")
        for args in saving
    )


def test_trainer_config_requeues_and_checkpoints() -> None:
    cfg = yaml.safe_load((REPO / "configs" / "trainer" / "slurm.yaml").read_text())["trainer"]
    assert cfg["strategy"] == "ddp" and cfg["precision"] == "bf16-mixed"
    paths = [c["class_path"] for c in cfg["callbacks+"]]
    assert "splitlab.callbacks.SlurmRequeue" in paths
    ckpt = next(c for c in cfg["callbacks+"] if c["class_path"].endswith("ModelCheckpoint"))
    assert ckpt["init_args"]["every_n_train_steps"] > 0


@pytest.mark.parametrize("extra", [[], ["fsdp.yaml"]], ids=["ddp", "fsdp"])
def test_slurm_config_composes_with_every_recipe(tmp_path, extra) -> None:
    """The README's cluster commands: every recipe, then slurm.yaml (and fsdp.yaml for the large backbones)."""
    from tests.helpers import composed_config

    for recipe in sorted((REPO / "tasks").glob("*.yaml")):
        configs = [recipe, REPO / "configs" / "trainer" / "slurm.yaml"]
        configs += [REPO / "configs" / "trainer" / name for name in extra]
        trainer = composed_config(tmp_path / f"{recipe.stem}.yaml", *configs)["trainer"]
        callbacks = [c["class_path"] for c in trainer["callbacks"]]
        assert (
            "splitlab.callbacks.SplitSchedule" in callbacks and "splitlab.callbacks.SlurmRequeue" in callbacks
        )
        if extra:
            assert trainer["strategy"]["class_path"] == "splitlab.distributed.BlockFSDPStrategy"
            assert trainer["strategy"]["init_args"]["sharding_strategy"] == "FULL_SHARD"


def test_dockerfile_lints_and_installs_the_project() -> None:
    dockerfile = REPO / "docker" / "Dockerfile"
    text = dockerfile.read_text()
    assert re.search(r"^FROM nvidia/cuda:\S+-runtime", text, re.M)
    assert 'ENTRYPOINT ["lightning"]' in text and "pip install" in text
    if tool("hadolint") is None:
        pytest.skip("hadolint not installed")
    done = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_fsdp_config_shards_per_block() -> None:
    from lightning.pytorch.strategies import FSDPStrategy
    from timm.models.eva import EvaBlock
    from timm.models.vision_transformer import Block

    from splitlab.distributed import BlockFSDPStrategy

    cfg = yaml.safe_load((REPO / "configs" / "trainer" / "fsdp.yaml").read_text())["trainer"]["strategy"]
    assert cfg["class_path"] == "splitlab.distributed.BlockFSDPStrategy"
    strategy = BlockFSDPStrategy(**cfg["init_args"])
    assert isinstance(strategy, FSDPStrategy)
    policy = strategy.kwargs["auto_wrap_policy"]
    assert {Block, EvaBlock} <= set(getattr(policy, "_module_classes", ()))
    assert strategy.kwargs["use_orig_params"]


def test_fsdp_mixed_precision_keeps_buffers_and_batches_in_their_dtype() -> None:
    """bf16 buffers would round the budgets (0.7 -> 0.69921875) and the λ controller's state, and a
    bf16 batch the targets (COCO boxes)."""
    from lightning.pytorch.plugins.precision import FSDPPrecision

    from splitlab.distributed import BlockFSDPStrategy

    strategy = BlockFSDPStrategy(precision_plugin=FSDPPrecision("bf16-mixed"))
    config = strategy.mixed_precision_config
    assert config.param_dtype == torch.bfloat16 and config.reduce_dtype == torch.bfloat16
    assert config.buffer_dtype is None and not config.cast_root_forward_inputs
    assert BlockFSDPStrategy().mixed_precision_config.buffer_dtype is None  # 32-true


def test_fsdp_without_sharding_is_refused() -> None:
    from splitlab.distributed import BlockFSDPStrategy

    with pytest.raises(ValueError, match="sharding_strategy=NO_SHARD: .*use trainer.strategy=ddp"):
        BlockFSDPStrategy(sharding_strategy="NO_SHARD")
    with pytest.raises(ValueError, match="state_dict_type=sharded: .*use state_dict_type=full"):
        BlockFSDPStrategy(state_dict_type="sharded")
