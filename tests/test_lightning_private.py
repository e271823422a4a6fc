"""Lightning's private names that `splitlab.lightning_private` relies on, checked on the installed
Lightning: a release that renames or changes one fails here, naming the adapter function to update,
instead of a resume, a requeue or a stopped epoch going wrong at run time."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import lightning
import pytest
from jsonargparse import Namespace
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import FSDPStrategy

from splitlab import lightning_private as lp
from splitlab.cli.checkpoints import HPC_NAME


class Tiny(LightningModule):
    """A model the LightningCLI can build by class path, saving its settings as splitlab's tasks do."""

    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()


def require(holds: bool, what: str, adapter: str) -> None:
    """Fail with one line naming the Lightning version, what changed and the function to update."""
    if not holds:
        pytest.fail(
            f"Lightning {lightning.__version__}: {what}. splitlab.lightning_private.{adapter} relies on it: "
            "update that function for this Lightning (callers need no change)",
            pytrace=False,
        )


def has(obj: Any, name: str, adapter: str) -> None:
    owner = obj.__name__ if isinstance(obj, type) else type(obj).__name__
    require(name in vars(obj) or hasattr(obj, name), f"{owner}.{name} is gone", adapter)


def parameters(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    return Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kwargs,
    )


def tiny_cli(cls: type[LightningCLI] = LightningCLI) -> LightningCLI:
    return cls(
        Tiny,
        subclass_mode_model=True,
        run=False,
        save_config_callback=None,
        seed_everything_default=False,
        args=[f"--model={Tiny.__module__}.Tiny", "--trainer.logger=false", "--trainer.accelerator=cpu"],
    )


def test_attached_trainer(tmp_path: Path) -> None:
    module = Tiny()
    require("_trainer" in vars(module), "LightningModule._trainer is gone", "attached_trainer")
    assert lp.attached_trainer(module) is None
    t = trainer(tmp_path)
    module.trainer = t
    assert lp.attached_trainer(module) is t


@pytest.mark.parametrize("sync", [False, True])
def test_syncs_batchnorm(tmp_path: Path, sync: bool) -> None:
    t = trainer(tmp_path, sync_batchnorm=sync)
    has(t, "_accelerator_connector", "syncs_batchnorm")
    require(
        "_layer_sync" in vars(t._accelerator_connector),
        "the accelerator connector's _layer_sync is gone",
        "syncs_batchnorm",
    )
    assert lp.syncs_batchnorm(t) is sync


def test_requeue_checkpoint_path(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    has(t, "_checkpoint_connector", "requeue_checkpoint_path")
    has(t._checkpoint_connector, "hpc_save_path", "requeue_checkpoint_path")
    require(
        parameters(type(t._checkpoint_connector).hpc_save_path) == ["folderpath"],
        "_CheckpointConnector.hpc_save_path is no longer hpc_save_path(folderpath)",
        "requeue_checkpoint_path",
    )
    assert lp.requeue_checkpoint_path(t) == str(tmp_path / "hpc_ckpt_1.ckpt")
    (tmp_path / "hpc_ckpt_3.ckpt").touch()
    path = Path(lp.requeue_checkpoint_path(t))
    assert path == tmp_path / "hpc_ckpt_4.ckpt"
    assert HPC_NAME.fullmatch(path.name)  # the name --ckpt_path hpc and a requeued job look for


def test_restart_train_iterator(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    require(
        "_data_fetcher" in vars(t.fit_loop), "the fit loop's _data_fetcher is gone", "restart_train_iterator"
    )
    lp.restart_train_iterator(t)  # no fetcher before fit: nothing to restart


def test_skip_next_validation(tmp_path: Path) -> None:
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    t = trainer(tmp_path)
    epoch_loop = t.fit_loop.epoch_loop
    require(
        "_skip_next_val" in vars(epoch_loop),
        "the training epoch loop's _skip_next_val is gone",
        "skip_next_validation",
    )
    require(
        "self._skip_next_val" in inspect.getsource(_TrainingEpochLoop.on_advance_end),
        "the training epoch loop no longer reads _skip_next_val after a batch",
        "skip_next_validation",
    )
    lp.skip_next_validation(t)
    assert epoch_loop._skip_next_val is True


def test_count_as_saved(tmp_path: Path) -> None:
    t = trainer(tmp_path, enable_checkpointing=True)
    (callback,) = t.checkpoint_callbacks
    require(
        "_last_global_step_saved" in vars(callback),
        "ModelCheckpoint._last_global_step_saved is gone",
        "count_as_saved",
    )
    require(
        "self._last_global_step_saved == trainer.global_step" in inspect.getsource(ModelCheckpoint),
        "ModelCheckpoint no longer skips a step whose _last_global_step_saved is the current step",
        "count_as_saved",
    )
    require(
        "on_train_end" not in vars(ModelCheckpoint)  # older releases save nothing there
        or "not self._last_checkpoint_saved" in inspect.getsource(ModelCheckpoint.on_train_end),
        "ModelCheckpoint.on_train_end no longer saves last.ckpt only when _last_checkpoint_saved is empty",
        "count_as_saved",
    )
    callback._last_global_step_saved = -1
    lp.count_as_saved(t, str(tmp_path / "interrupted.ckpt"))
    assert callback._last_global_step_saved == t.global_step
    assert callback._last_checkpoint_saved == str(tmp_path / "interrupted.ckpt")


def test_batches_that_stepped(tmp_path: Path) -> None:
    loops = trainer(tmp_path).fit_loop.state_dict()
    require(
        "_batches_that_stepped" in loops.get("epoch_loop.state_dict", {}),
        "a checkpoint's fit loop state no longer holds epoch_loop.state_dict._batches_that_stepped",
        "batches_that_stepped",
    )
    assert "epoch_loop.batch_progress" in loops  # splitlab.cli.checkpoints.logged_step reads it beside
    assert lp.batches_that_stepped({"loops": {"fit_loop": loops}}) == 0
    assert lp.batches_that_stepped({"global_step": 3}) is None


def test_saved_model_settings() -> None:
    hparams = dict(tiny_cli().model.hparams)
    require(
        {"_class_path", "_instantiator"} <= set(hparams),
        f"the LightningCLI saves a model's hyperparameters as {sorted(hparams)}, without _class_path and "
        "_instantiator",
        "saved_model_settings",
    )
    class_path, settings = lp.saved_model_settings({"hyper_parameters": hparams})
    assert class_path == f"{Tiny.__module__}.Tiny" and settings == {"width": 3}


def test_cli_setting() -> None:
    has(LightningCLI, "_get", "cli_setting")
    require(
        parameters(LightningCLI._get) == ["self", "config", "key", "default"],
        "LightningCLI._get is no longer _get(self, config, key, default)",
        "cli_setting",
    )
    cli = tiny_cli()  # built without a subcommand: the key is read at the top level
    assert lp.cli_setting(cli, Namespace(trainer={"callbacks": [1]}), "trainer") == {"callbacks": [1]}
    assert lp.cli_setting(cli, Namespace(), "trainer", default={}) == {}


def test_checkpoint_config_hook() -> None:
    has(LightningCLI, "_parse_ckpt_path", "CheckpointConfigHook")
    require(
        parameters(LightningCLI._parse_ckpt_path) == ["self"],
        "LightningCLI._parse_ckpt_path is no longer _parse_ckpt_path(self)",
        "CheckpointConfigHook",
    )
    require(
        not hasattr(LightningCLI, "config_from_checkpoint"),
        "LightningCLI now has a config_from_checkpoint of its own, which SplitLabCLI's would replace",
        "CheckpointConfigHook",
    )
    calls = []

    class Probe(lp.CheckpointConfigHook, LightningCLI):
        def config_from_checkpoint(self) -> None:
            calls.append(hasattr(self, "config") and not hasattr(self, "config_init"))

    tiny_cli(Probe)
    require(
        calls == [True],
        "LightningCLI.__init__ no longer calls _parse_ckpt_path once, after parsing and before instantiating",
        "CheckpointConfigHook",
    )


def test_model_setup_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    has(FSDPStrategy, "_setup_model", "ModelSetupHook")
    require(
        parameters(FSDPStrategy._setup_model) == ["self", "model"],
        "FSDPStrategy._setup_model is no longer _setup_model(self, model)",
        "ModelSetupHook",
    )
    require(
        "self._setup_model(self.model)" in inspect.getsource(FSDPStrategy.setup),
        "FSDPStrategy.setup no longer wraps the model with _setup_model",
        "ModelSetupHook",
    )
    require(
        not any(hasattr(FSDPStrategy, name) for name in ("wrap_model", "lightning_wrap_model")),
        "FSDPStrategy now has a wrap_model or lightning_wrap_model of its own, which the hook would replace",
        "ModelSetupHook",
    )

    class Strategy(lp.ModelSetupHook, FSDPStrategy):
        def wrap_model(self, model: Any) -> Any:
            return ("splitlab", self.lightning_wrap_model(model))

    monkeypatch.setattr(FSDPStrategy, "_setup_model", lambda self, model: ("lightning", model))
    assert Strategy()._setup_model("m") == ("splitlab", ("lightning", "m"))


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_fsdp_state_dict_type(kind: str) -> None:
    strategy = FSDPStrategy(state_dict_type=kind)
    require(
        "_state_dict_type" in vars(strategy), "FSDPStrategy._state_dict_type is gone", "fsdp_state_dict_type"
    )
    assert lp.fsdp_state_dict_type(strategy) == kind


def test_outside_given_hyperparameters() -> None:
    """Inside the CLI's context a module records the given config; built in the cleared one, its own."""
    from lightning.pytorch.core.mixins import hparams_mixin

    require(
        hasattr(hparams_mixin, "_given_hyperparameters_context")
        and hasattr(hparams_mixin, "_given_hyperparameters"),
        "lightning.pytorch.core.mixins.hparams_mixin._given_hyperparameters(_context) is gone",
        "outside_given_hyperparameters",
    )
    given = {"_class_path": "elsewhere.Outer", "other": 1}
    with hparams_mixin._given_hyperparameters_context(given, "lightning.pytorch.cli.instantiate_module"):
        assert "width" not in Tiny(width=5).hparams  # what the cleared context is for
        with lp.outside_given_hyperparameters():
            assert dict(Tiny(width=5).hparams) == {"width": 5}


# Lightning's private names the adapter holds. Outside it they are read only where listed in PENDING.
PRIVATE = re.compile(
    r"\.(_trainer|_accelerator_connector|_checkpoint_connector|_data_fetcher|_skip_next_val"
    r"|_last_global_step_saved|_state_dict_type|_setup_model|_parse_ckpt_path|_get|_layer_sync)\b"
    r"|[\"'](_batches_that_stepped|_class_path|_instantiator|_layer_sync)[\"']"
)
# files still allowed to read them directly (none)
PENDING: set[str] = set()


def test_no_private_name_outside_the_adapter() -> None:
    root = Path(__file__).resolve().parents[1]
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted((root / "splitlab").rglob("*.py"))
        if path.name != "lightning_private.py" and str(path.relative_to(root)) not in PENDING
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert not found, "Lightning private names outside splitlab/lightning_private.py:\n" + "\n".join(found)
