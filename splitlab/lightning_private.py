"""Lightning's private names, in one place: every use splitlab makes of them goes through here.

Lightning offers no public way to do what these do (resume mid-epoch, skip a stopped epoch's
validation, name SLURM's requeue checkpoint, ...), and its private names may change in any
release. Kept behind small functions, a Lightning upgrade is checked against one module:
`tests/test_lightning_private.py` fails, naming the function, when any name here is gone or
changed. Importable from every room that may use Lightning (it imports nothing of splitlab, and
Lightning only for type hints).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning import LightningModule, Trainer
    from lightning.pytorch.cli import LightningCLI
    from torch import nn


def attached_trainer(module: LightningModule) -> Trainer | None:
    """The trainer ``module`` is attached to, or None: ``module.trainer`` raises when there is none."""
    return module._trainer


def syncs_batchnorm(trainer: Trainer) -> bool:
    """Whether the trainer converts BatchNorm layers to synchronised ones (``sync_batchnorm=True``).

    The conversion happens later, in the strategy's setup, so the layers cannot be inspected yet.
    """
    return getattr(trainer._accelerator_connector, "_layer_sync", None) is not None


def requeue_checkpoint_path(trainer: Trainer) -> str:
    """The next ``hpc_ckpt_N.ckpt`` in ``default_root_dir``: where Lightning looks for the checkpoint
    when a requeued SLURM job starts again."""
    return trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)


def restart_train_iterator(trainer: Trainer) -> None:
    """Build the training epoch's iterator again, dropping what DataLoader workers drew already (after
    the sampler's epoch or skip changed: Lightning builds the iterator before ``on_train_start``)."""
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:
        iter(fetcher)


def skip_next_validation(trainer: Trainer) -> None:
    """No validation at the end of the current training epoch (one stopped early is not finished)."""
    trainer.fit_loop.epoch_loop._skip_next_val = True


def count_as_saved(trainer: Trainer, path: str) -> None:
    """Let every checkpoint callback take the current step as saved already, to ``path``, so that
    neither the end of an epoch stopped early nor the end of training saves it again as a finished
    one (``save_last`` writes ``last.ckpt`` at the end of training when no checkpoint was saved yet:
    after a stop in the first epoch, that ``last.ckpt`` marked epoch 0 finished)."""
    for callback in trainer.checkpoint_callbacks:
        callback._last_global_step_saved = trainer.global_step
        callback._last_checkpoint_saved = path


def batches_that_stepped(checkpoint: dict[str, Any]) -> int | None:
    """The training loop's count of batches that stepped an optimizer, as a checkpoint saved it (the
    step Lightning logs at); None in a checkpoint without it."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    return loops.get("epoch_loop.state_dict", {}).get("_batches_that_stepped")


def saved_model_settings(checkpoint: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The model's class path and init arguments as the LightningCLI saved them in a checkpoint's
    hyperparameters (the class path under a private key, beside the instantiator's)."""
    from splitlab.checkpoint import (
        plain,  # torch alone: a settings group kept as its dataclass, as its fields
    )

    saved = plain(dict(checkpoint.get("hyper_parameters", {})))
    saved.pop("_instantiator", None)
    return saved.pop("_class_path", None), saved


def cli_setting(cli: LightningCLI, config: Any, key: str, default: Any = None) -> Any:
    """``key`` of ``config``, inside the running subcommand's section when there is one."""
    return cli._get(config, key, default=default)


def fsdp_state_dict_type(strategy: Any) -> str:
    """``"full"`` or ``"sharded"``: how an `FSDPStrategy` writes checkpoints."""
    return strategy._state_dict_type


class CheckpointConfigHook:
    """For a `LightningCLI` subclass: `config_from_checkpoint` runs where Lightning's private
    ``_parse_ckpt_path`` would, after parsing and before anything is instantiated.

    List it before ``LightningCLI`` among the bases.
    """

    def _parse_ckpt_path(self) -> None:
        self.config_from_checkpoint()

    def config_from_checkpoint(self) -> None:
        """Update ``self.config`` from ``--ckpt_path``'s checkpoint (subclasses say how)."""
        raise NotImplementedError


class ModelSetupHook:
    """For an `FSDPStrategy` subclass: `wrap_model` wraps the model where Lightning's private
    ``_setup_model`` would, and `lightning_wrap_model` is Lightning's own wrapping.

    List it before ``FSDPStrategy`` among the bases.
    """

    def _setup_model(self, model: nn.Module) -> nn.Module:
        return self.wrap_model(model)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Wrap ``model`` for training (subclasses extend `lightning_wrap_model`)."""
        return self.lightning_wrap_model(model)

    def lightning_wrap_model(self, model: nn.Module) -> nn.Module:
        """Lightning's wrapping of ``model`` (the next base's private ``_setup_model``)."""
        return super()._setup_model(model)  # type: ignore[misc]


def outside_given_hyperparameters() -> Any:
    """A context in which a data module or LightningModule built records its own arguments as its
    hyperparameters. LightningCLI builds each module inside a context that gives the module's config
    to ``save_hyperparameters``; a module that builds others in its ``__init__`` (a multi-task run's
    data modules) would otherwise give them its own config."""
    from contextlib import contextmanager

    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters

    @contextmanager
    def cleared() -> Any:
        token = _given_hyperparameters.set(None)
        try:
            yield
        finally:
            _given_hyperparameters.reset(token)

    return cleared()
