"""`TaskHooks`: Lightning's part of a `SplitTask`, its one base: every hook, in the order a run calls
them, the optimizers, the distributed backward and clipping, logging and the checkpoint entry.

The work is done by what the task holds and hands on explicitly: the training object (``algorithm``,
`splitlab.training.SplitTraining`), the comparison (``comparison``, `PolicyComparison`), the task's
own code (``logic``) and the plain functions of tasks/calibration.py, evaluation.py, optimization.py
and state.py. A hook reads of its task only what `SplitTask` defines (tests/tasks/test_task_parts.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from lightning import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.distributed.fsdp import FullyShardedDataParallel

from splitlab.checkpoint import plain
from splitlab.distributed import average_gradients, block_parameter_ids, clip_grad_norm, sharded_backward
from splitlab.lightning_private import attached_trainer
from splitlab.model.preprocess import Preprocessing
from splitlab.report import format_table, summary_record, write_summary
from splitlab.tasks.calibration import apt_pending, calibration_sample
from splitlab.tasks.evaluation import named_rows, prediction_records
from splitlab.tasks.optimization import stage_steps
from splitlab.tasks.training import run_callbacks
from splitlab.tokenizer import entropy_scores
from splitlab.tokenizer.baselines import cuts_from_thresholds
from splitlab.training import Optimizers
from splitlab.training.apt import fit_apt_cuts
from splitlab.training.progress import Stage


class TaskHooks(LightningModule):
    """Lightning's part of a `SplitTask` (see the module): what runs when, and how it reaches the
    objects that do the work. Manual optimisation as Lightning's docs describe it: two optimizers
    (task and policy, the training object's), ``manual_backward``, schedulers stepped by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.stage_plan: dict[str, int] | None = None  # epochs of each stage in this fit
        self.ppo_total_steps = 1  # PPO batches planned in this fit (`configure_optimizers`)

    # ----------------------------------------------------------------------------- fit: set-up
    def configure_callbacks(self) -> list[Any]:
        """The run's callbacks the trainer lacks (`splitlab.callbacks.RUN_CALLBACKS`): the stage
        schedule, exact resume, the checkpoint on a stop, skipped-sample counts, verified checkpoint
        writes. ``Trainer().fit(task, data)`` from Python so trains what ``lightning fit`` trains
        (warm start, then PPO); callbacks the user passes, a `SplitSchedule` included, win."""
        return run_callbacks(self.trainer.callbacks, fitting=self.trainer.state.fn == "fit")

    def setup(self, stage: str) -> None:
        if attached_trainer(self) is None:
            return
        precision = str(self.trainer.precision)
        if stage == "fit" and precision.startswith("16"):
            raise ValueError(
                f"trainer.precision={precision}: float16 training is not supported (two optimisers step per "
                "batch, task and policy, and Lightning's manual optimisation neither unscales before clipping "
                "nor updates the loss scale once for both): use bf16-mixed (the recipes') or 32-true"
            )
        datamodule = self.trainer.datamodule
        if datamodule is not None:
            self.check_data(datamodule)
            self.adopt_data(datamodule)

    def plan_stages(self, dense: int, warm_start: int, ppo: int) -> None:
        """Epochs of each stage in this fit, so learning-rate schedules span the right number of steps."""
        self.stage_plan = {"dense": int(dense), "warm_start": int(warm_start), "ppo": int(ppo)}

    def configure_optimizers(self) -> Any:
        """The training object's two optimizers and the task's schedule, over this fit's stage plan."""
        supervised, ppo = (
            stage_steps(self.trainer, self.stage_plan, which) for which in ("supervised", "ppo")
        )
        optimizers = self.algorithm.optimizers(supervised, ppo)
        self.ppo_total_steps = optimizers.ppo_steps  # the policy's learning rate anneals over them
        return [optimizers.task, optimizers.policy], [optimizers.task_schedule]

    # ----------------------------------------------------------------------------- fit: stages and steps
    def set_stage(self, stage: Stage) -> None:
        """Enter a stage (`SplitTraining.enter`: PPO freezes backbone, head and embeddings)."""
        self.algorithm.enter(stage, self.training)
        if self.task_frozen and attached_trainer(self) is not None and self.trainer.optimizers:
            self.trainer.optimizers[0].zero_grad(set_to_none=True)  # else they stay allocated all stage

    @property
    def task_frozen(self) -> bool:
        """Whether this stage leaves backbone, head and embeddings as they are (`Progress.task_frozen`)."""
        return self.algorithm.task_frozen

    def train(self, mode: bool = True) -> TaskHooks:
        super().train(mode)
        if mode and self.task_frozen:  # frozen parts stay deterministic: no dropout in rewards
            for module in self.algorithm.task_modules():
                module.eval()
        return self

    def on_train_start(self) -> None:
        if self.hparams.policy == "entropy":  # APT trains at its fixed cuts too
            self.recalibrate()

    def on_train_epoch_start(self) -> None:
        if self.apt_waits():  # a dense stage ran first in this fit: its backbone is ready now
            self.recalibrate()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        images, targets = self.unpack_batch(batch)
        task_opt, policy_opt = self.optimizers()
        steps = Optimizers(  # Lightning's steps, distributed backward and clipping; the steps so far
            task_opt,
            policy_opt,
            self.lr_schedulers(),
            self.ppo_total_steps,
            self.global_step,
            self.backward_synced,
            self.clip_norm,
        )
        stats = self.algorithm.training_step(images, targets, batch, steps)
        if stats is None:
            return None  # nothing learns: a fixed (or frozen transferred) policy with the task frozen
        batch_size = images.shape[0]
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=batch_size)
        self.log("lambda", self.controller.value_at(self.budget), prog_bar=True, batch_size=batch_size)
        return stats["loss"]

    def backward_synced(self, loss: Tensor, optimizers: list[torch.optim.Optimizer]) -> None:
        """``manual_backward``, then one coalesced all-reduce (mean) of the optimizers' gradients under
        DDP (under FSDP, of those outside the sharded blocks: FSDP reduce-scatters the blocks' own).

        DDP's reducer needs every trainable parameter to receive a gradient in every backward
        (or ``find_unused_parameters``, a graph walk per step). Here the used set depends on the
        data (a level with no kept token on one rank gives its embedding no gradient) and on the
        stage (PPO's K backward passes touch only the decision module), so the backward runs
        without DDP's sync and the gradients are averaged here: missing ones count as zero, so
        every rank applies the same update. In PPO only the small policy is communicated.
        """
        model = self.trainer.model if attached_trainer(self) is not None else None
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            with model.no_sync():
                self.manual_backward(loss)
            sharded: set[int] = set()
        elif isinstance(model, FullyShardedDataParallel):
            sharded_backward(model, lambda: self.manual_backward(loss))
            sharded = block_parameter_ids(self)
        else:
            self.manual_backward(loss)
            return
        average_gradients(
            p
            for opt in optimizers
            for group in opt.param_groups
            for p in group["params"]
            if p.requires_grad and id(p) not in sharded
        )

    def clip_norm(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        """Clip an optimizer's gradients to ``max_norm`` (Lightning's clipping, or, under FSDP where
        Lightning cannot clip by norm, one that counts the sharded blocks' gradients over ranks)."""
        model = self.trainer.model if attached_trainer(self) is not None else None
        if not isinstance(model, FullyShardedDataParallel):
            self.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]

        def over_shards(t: Tensor) -> Tensor:  # the ranks that split one copy (one node under HYBRID_SHARD)
            torch.distributed.all_reduce(t, group=model.process_group)
            return t

        clip_grad_norm(params, max_norm, block_parameter_ids(self), over_shards)

    # ----------------------------------------------------------------------------- the deployed cuts
    def apt_waits(self) -> bool:
        """Whether APT, the trained policy, still needs its cuts (`apt_pending`)."""
        return apt_pending(self.hparams.policy, self.hparams.policy_options, self.model, self.stage)

    @torch.no_grad()
    def recalibrate(self) -> None:
        """Set every operating point from a fixed sample of training images under the current policy.

        The running average of the steps' own calibration lags when PPO moves the logits quickly
        (measured on the COCO twin: deployed 0.44 for a budget of 0.50); before each validation of a
        fit the cuts are therefore recomputed exactly, as "precise BatchNorm" recomputes statistics:
        ``calibration_images`` training images (the same ones every time, with the training
        transforms) through embedding and decision module only (`SplitTraining.fit_cuts`). The global
        RNG is forked, so training randomness is unchanged; under DDP the cuts are averaged over
        ranks. With ``policy: entropy`` APT's fixed per-level entropy cuts are set once
        (`splitlab.training.apt`; its metric search runs backbone and head on the sample too).
        """
        hp = self.hparams
        count, options = int(hp.evaluation.calibration_images), hp.policy_options
        learned, apt = self.deployed_policy == "learned", self.apt_waits()
        if apt and options.entropy_thresholds is not None:  # APT's own thresholds: no calibration
            self.model.apt_cuts.copy_(cuts_from_thresholds(options.entropy_thresholds, self.levels))
            self.model.apt_budget.fill_(self.budget)
        loaders = self.trainer.train_dataloader if attached_trainer(self) is not None else None
        wanted = count > 0 and (learned or apt)
        sample = calibration_sample(loaders, count, int(options.sampling_seed)) if wanted else None
        if sample is None:
            return

        def batches() -> Any:  # (made inside the forked RNG: a loader's iterator draws its base seed)
            for batch in sample:
                yield self.unpack_batch(self.transfer_batch_to_device(batch, self.device, 0))

        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), self.trainer.precision_plugin.forward_context():
            if apt:
                mean, std = self.model.preprocessing.mean, self.model.preprocessing.std
                entropies = [entropy_scores(x, self.levels, mean=mean, std=std) for x, _ in batches()]
                search = options.apt_search if options.entropy_thresholds is None else None
                rank_zero_info(f"splitlab: {fit_apt_cuts(self.algorithm, batches, entropies, search)}")
            elif learned:  # the training object's cuts, from the sample's logits
                self.algorithm.fit_cuts(x for x, _ in batches())

    # ----------------------------------------------------------------------------- evaluation
    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self.recalibrate()  # the deployed cuts of the policy as trained so far
        self.note_unreachable_budgets()

    def on_test_start(self) -> None:
        self.note_unreachable_budgets()

    def evaluates_baselines(self) -> bool:
        trainer = self.trainer
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != "fit":
            return True
        return trainer.current_epoch + 1 >= (trainer.max_epochs or 0)

    def note_unreachable_budgets(self) -> None:
        """One line when the hard cap leaves a budget out of reach (the cap keeps whole splits, so
        ``max_fraction: 0.5`` can mean 31 of 64 tokens): what the deployed policy meets instead."""
        if self.trainer.sanity_checking or (self.trainer.state.fn == "fit" and self.current_epoch > 0):
            return  # once per command
        limit = self.model.cap_limit()
        budgets = (self.budget, *self.comparison.extra_budgets)
        over = [b for b in budgets if limit is not None and b > limit + 1e-9]
        if over:
            finest = self.levels.finest_grid(self.backbone.img_size)
            cells = finest[0] * finest[1]
            rank_zero_info(
                f"max_fraction={self.model.config['max_fraction']:g} leaves each image at most {round(limit * cells)} of "
                f"{cells} tokens (whole splits), a fraction of {limit:.3f}: budget "
                f"{', '.join(f'{b:g}' for b in over)} is out of reach, met at most at {limit:.3f} (every image at the cap)"
            )

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "test")

    def _eval_step(self, batch: Any, batch_idx: int, split: str) -> dict[str, Any]:
        images, layout = self.comparison.step(batch, batch_idx, split, self.evaluates_baselines())
        return {"images": images, "layout": layout} if batch_idx == 0 else {}

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def _eval_epoch_end(self, split: str) -> None:
        """Log the split's rows; at the end of fit, validate and test, write the summary."""
        results = self.comparison.results(split)
        if "learned" not in results:
            return
        learned, metric = results["learned"], self.metric_name
        self.log(f"{split}/{metric}", learned.get(metric, float("nan")), prog_bar=True, sync_dist=False)
        self.log(f"{split}/fraction", learned["token_fraction_mean"], prog_bar=True)
        self.log(f"{split}/fraction_std", learned["token_fraction_std"], prog_bar=True)
        if "object_fine_coverage" in learned:  # where the fine tokens went, epoch by epoch
            self.log(f"{split}/object_fine_coverage", learned["object_fine_coverage"])
        lam = self.controller.value_at(self.budget)
        self.log("lambda", lam, prog_bar=True)
        for policy, values in results.items():
            if policy != "learned":
                self.log(f"{split}/{policy}/{metric}", values.get(metric, float("nan")))
                self.log(f"{split}/{policy}/fraction", values["token_fraction_mean"])
        if not self.evaluates_baselines():  # the summary is written at the end of fit, validate and test
            return
        ppo_ran = self.stage == "ppo" and self.algorithm.progress.ppo_steps > 0
        trained, rows = named_rows(
            results, self.deployed_policy, self.hparams.policy, ppo_ran, self.learned_name
        )
        fn, columns = str(self.trainer.state.fn.value), self.logic.summary_columns()
        record = summary_record(
            self.task_name, metric, self.budget, lam, rows, fn, trained_policy=trained, columns=columns
        )
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir  # on every rank: a broadcast
        if self.trainer.is_global_zero:
            write_summary(record, log_dir)
            rank_zero_info("\n" + format_table(record))

    def predict_step(
        self, batch: Any, batch_idx: int, outputs: Any = None, layout: Any = None
    ) -> list[dict[str, Any]]:
        """Each image's source, layout and prediction (`prediction_records`; ``outputs`` and ``layout``
        when the caller already computed them). A batch whose files were all unusable is None: no rows."""
        if batch is None:
            return []
        images, targets = self.unpack_batch(batch) if isinstance(batch, list | tuple) else (batch, None)
        if layout is None:
            outputs, layout = self(images, seed=batch_idx)
        return prediction_records(self.logic, batch, batch_idx, targets, outputs, layout)

    # ----------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the settings groups as plain mappings: a checkpoint holds data, never a class to import
        checkpoint["hyper_parameters"] = plain(checkpoint.get("hyper_parameters", {}))
        self.model.trained = self.algorithm.progress.record()  # what `holds` reports
        checkpoint["splitlab"] = {
            "task_class": f"{type(self).__module__}.{type(self).__qualname__}",
            **self.algorithm.progress.record(),
            "generators": self._generator_states(),
            "model": self.model.export_config(),  # what `splitlab.load` rebuilds the model from
        }
        rebuilt = self.rebuilt.left_out()
        if rebuilt:
            weights = checkpoint.get("state_dict", {})
            for key in rebuilt:
                weights.pop(key, None)
            checkpoint["splitlab"]["rebuilt"] = sorted(rebuilt)

    def _generator_states(self) -> list[torch.Tensor]:
        """Every rank's generator state (gathered: only rank 0 writes the checkpoint)."""
        state = self.generator.get_state()
        if attached_trainer(self) is None or self.trainer.world_size == 1:
            return [state]
        gathered = self.trainer.strategy.all_gather(state.to(self.device))
        # clone: a generator's set_state reads a row view of one shared storage wrongly (segfault)
        return [g.cpu().clone() for g in gathered.reshape(self.trainer.world_size, -1)]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trained = checkpoint.get("state_dict", {}).get("model.tokenizer.operating_points.budgets")
        mine = self.tokenizer.operating_points.budgets
        if trained is not None and (
            trained.shape != mine.shape or not torch.allclose(trained.cpu(), mine.cpu())
        ):
            lo, hi = float(trained[0]), float(trained[-1])
            span = (
                f"[{lo:g}, {hi:g}] (budget_range: [{lo:g}, {hi:g}])" if len(trained) > 1 else f"{lo:g} only"
            )
            raise ValueError(
                f"the checkpoint's policy was trained for budgets {span}; this run asks for "
                f"budget={self.budget:g} with budget_range={self.hparams.budget_range}: "
                "use the checkpoint's budget_range, and a budget inside it"
            )
        state = checkpoint.get("splitlab", {})
        if "state_dict" in checkpoint:
            self.rebuilt.fill(checkpoint["state_dict"], state, "the checkpoint", self.state_dict)
        saved = state.get("model", {})
        if saved.get("preprocessing"):  # a data module, when there is one, sets them again at setup
            self.model.preprocessing = Preprocessing.from_dict(saved["preprocessing"])
        if saved.get("names"):
            self.model.names = list(saved["names"])
        if saved.get("head", {}).get("category_ids"):
            ids = list(saved["head"]["category_ids"])
            self.model.set_head_settings(replace(self.model.head_settings, category_ids=ids))
        if self.algorithm.progress.restore(state):
            self.sync_deployed()
        states = state.get("generators", [])
        ranks = self.trainer.world_size if attached_trainer(self) is not None else 1
        if states and len(states) != ranks:
            rank_zero_warn(
                f"the checkpoint was saved by {len(states)} rank(s), this run has {ranks}: the sampling "
                "streams of ranks it lacks start fresh, and a mid-epoch resume skips another share of the "
                f"data; resume on {len(states)} rank(s) to continue exactly"
            )
        if states:
            self.sampling.resume(states[self.rank].clone() if self.rank < len(states) else None)
