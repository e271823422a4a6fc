"""How a `SplitTask` is evaluated: `PolicyComparison`, a plain object that lays out and scores the
learned layout beside the baselines (any loop can feed it batches), and `PolicyEvaluation`, Lightning's
part: the validation, test and predict steps, logging and the summary."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from splitlab.metrics import PolicyStats, timed
from splitlab.model import SplitModel
from splitlab.report import format_table, summary_record, write_summary
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.settings import EvaluationSettings
from splitlab.tokenizer import TokenLayout, annotation_labels, gain_labels
from splitlab.training import SplitTraining, autograd_ready

ORACLES = ("oracle", "loss_oracle")  # the rows that read the targets: bounds, never deployed


def slot(name: str) -> str:
    """The metric container's key of a policy row (module names may not contain dots)."""
    return name.replace(".", "_")


def at(budget: float) -> str:
    """Suffix of the rows evaluated at a further budget: ``learned@0.3``."""
    return f"@{budget:g}"


class PolicyComparison:
    """The learned layout beside the baselines at its realised fraction (and at each further budget),
    each row's metrics and timing (`PolicyStats`), per split (``val``, ``test``).

    A plain object on the deployed model, the task's logic (outputs, metrics, annotations) and the
    training object (the deployed policy, the loss gains the ``loss_oracle`` row reads): a Lightning
    task's hooks feed it batches (`PolicyEvaluation`), a plain loop can too. ``stores`` holds the
    metrics; its holder registers it, so that the metrics move with the model.

    Args:
        model: the deployed model.
        logic: the task's own code (`TaskLogic`).
        algorithm: the training object.
        settings: the rows and further budgets (`EvaluationSettings`).
    """

    def __init__(
        self, model: SplitModel, logic: TaskLogic, algorithm: SplitTraining, settings: EvaluationSettings
    ) -> None:
        self.model, self.logic, self.algorithm, self.settings = model, logic, algorithm, settings
        self.stores = nn.ModuleDict({split: self.new_stores() for split in ("val", "test")})

    def new_stores(self) -> nn.ModuleDict:
        """A `PolicyStats` per evaluated policy (and budget), by its slot."""
        return nn.ModuleDict(
            {slot(name): PolicyStats(self.logic.build_metrics()) for name in self.policy_names()}
        )

    def policy_names(self) -> list[str]:
        """Rows of the comparison: the learned policy and each baseline, then the same at every
        further evaluation budget (the uniform grid has no budget: it appears once)."""
        baselines = list(self.settings.eval_baselines)
        names = ["learned", *baselines]
        for budget in self.extra_budgets:
            names += [n + at(budget) for n in ("learned", *baselines) if n != "uniform"]
        return names

    @property
    def extra_budgets(self) -> list[float]:
        """The evaluation budgets besides the model's."""
        return [float(b) for b in self.settings.eval_budgets if abs(b - self.model.budget) > 1e-9]

    def forward(
        self, images: Tensor, budget: float | None = None, policy: str | None = None, seed: int = 0
    ) -> tuple[Any, TokenLayout]:
        """Task outputs and the layout used: ``policy``'s (default: the deployed one) at ``budget``."""
        policy = self.algorithm.deployed_policy if policy is None else policy
        layout = self.model.layout(images, budget, None, policy, seed)
        return self.logic.forward_layout(layout), layout

    def step(self, batch: Any, batch_idx: int, split: str, full: bool = True) -> tuple[Tensor, TokenLayout]:
        """Score one batch: the deployed policy at the budget; with ``full``, every baseline at its
        realised fraction and every row at the further budgets. The images and the deployed layout."""
        images, targets = self.logic.unpack_batch(batch)
        stats = self.stores[split]
        deployed = self.algorithm.deployed_policy
        budgets = [self.model.budget, *(self.extra_budgets if full and deployed == "learned" else ())]
        first = None
        for budget in budgets:
            suffix = "" if budget == budgets[0] else at(budget)
            with timed(images.device) as elapsed:
                outputs, layout = self.forward(images, budget=budget, seed=batch_idx)
                outputs = self.logic.finish_outputs(outputs, targets)
            self._record(stats[slot("learned" + suffix)], outputs, targets, layout, elapsed())
            first = first or layout
            if not full:
                continue
            realised = max(float(layout.fraction.mean()), self.model.levels.min_fraction)
            for policy in self.settings.eval_baselines:
                if policy == deployed or (suffix and policy == "uniform"):
                    continue
                with timed(images.device) as elapsed:
                    if policy in ORACLES:
                        oracle = self.oracle_layout if policy == "oracle" else self.loss_oracle_layout
                        base = oracle(images, batch, realised, batch_idx)
                        out = self.logic.forward_layout(base)
                    else:
                        out, base = self.forward(images, policy=policy, budget=realised, seed=batch_idx)
                    out = self.logic.finish_outputs(out, targets)
                self._record(stats[slot(policy + suffix)], out, targets, base, elapsed())
        return images, first

    def _record(self, stat: Any, outputs: Any, targets: Any, layout: Any, seconds: float) -> None:
        stat.update_layout(layout.fraction, seconds)
        self.logic.update_metrics(stat.metrics, outputs, targets, layout)

    def oracle_layout(self, images: Tensor, batch: Any, budget: float, seed: int) -> TokenLayout:
        """The ``oracle`` row's layout: finest tokens where the annotations are, as many as ``budget``
        buys on this batch (`annotation_labels`), through the tokenizer's walk like every other row.
        An upper bound, not a policy: it reads the labels."""
        levels = self.model.levels
        cells = self.logic.annotated_cells(batch, levels.grid(levels.num - 1, tuple(images.shape[-2:])))
        if cells is None:
            raise ValueError(
                "eval_baselines includes oracle, but this data's targets say nothing about where the objects "
                f"are ({self.logic.task_name}): drop oracle from model.init_args.evaluation.eval_baselines"
            )
        generator = torch.Generator(images.device).manual_seed(seed)
        decisions, _ = annotation_labels(cells.to(images.device), levels, budget, generator)
        scores = [d.float() for d in decisions]
        return self.model.tokenizer(images, self.model.backbone, mode="scores", scores=scores, threshold=0.5)

    def loss_oracle_layout(self, images: Tensor, batch: Any, budget: float, seed: int) -> TokenLayout:
        """The ``loss_oracle`` row's layout: the splits worth most to this batch's task loss first
        (`refinement_gains`, read through the task's per-image loss), as many as ``budget`` buys. It
        reads the targets through the loss, so it needs no annotations; like ``oracle``, a bound."""
        generator = torch.Generator(images.device).manual_seed(seed)
        with torch.inference_mode(False):  # validation's tensors, as autograd can read them
            plain_images = autograd_ready(images)
            _, targets = self.logic.unpack_batch(autograd_ready(batch))
            gains = self.algorithm.loss_gains(plain_images, targets, generator)
        levels = self.model.levels
        scores = [
            d.float() for d in gain_labels(gains, levels, budget, levels.finest_grid(images.shape[-2:]))
        ]
        return self.model.tokenizer(images, self.model.backbone, mode="scores", scores=scores, threshold=0.5)

    def results(self, split: str) -> dict[str, dict[str, float]]:
        """Each scored row's metrics since the last call (the stores start afresh), as the task's logic
        finishes them."""
        results = {}
        for policy in self.policy_names():
            stat = self.stores[split][slot(policy)]
            if stat.images.update_called:
                results[policy] = stat.compute()
            stat.reset()
        return self.logic.finish_results(results)


class PolicyEvaluation:
    """Lightning's part of evaluating a `SplitTask`: the validation, test and predict steps (the work
    is its `PolicyComparison`, ``comparison``), the logged metrics, the summary and prediction records.

    Uses of its task only what `SplitTask` defines (``comparison``, ``controller``, ``algorithm``, the
    model parts) and Lightning's; the task's own hooks are its ``logic``'s.
    """

    # what the summary calls the policy a task trains with PPO (a multi-task run's: ``multitask``)
    learned_name = "learned"

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
            finest = math.prod(self.levels.grid(self.levels.num - 1, self.backbone.img_size))
            rank_zero_info(
                f"max_fraction={self.model.config['max_fraction']:g} leaves each image at most {round(limit * finest)} of "
                f"{finest} tokens (whole splits), a fraction of {limit:.3f}: budget "
                f"{', '.join(f'{b:g}' for b in over)} is out of reach, met at most at {limit:.3f} (every image at the cap)"
            )

    def _eval_step(self, batch: Any, batch_idx: int, split: str) -> dict[str, Any]:
        images, layout = self.comparison.step(batch, batch_idx, split, self.evaluates_baselines())
        return {"images": images, "layout": layout} if batch_idx == 0 else {}

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, "test")

    def _eval_epoch_end(self, split: str) -> None:
        results = self.comparison.results(split)
        if "learned" not in results:
            return
        learned = results["learned"]
        self.log(
            f"{split}/{self.metric_name}",
            learned.get(self.metric_name, float("nan")),
            prog_bar=True,
            sync_dist=False,
        )
        self.log(f"{split}/fraction", learned["token_fraction_mean"], prog_bar=True)
        self.log(f"{split}/fraction_std", learned["token_fraction_std"], prog_bar=True)
        if "object_fine_coverage" in learned:  # where the fine tokens went, epoch by epoch
            self.log(f"{split}/object_fine_coverage", learned["object_fine_coverage"])
        self.log("lambda", self.controller.value_at(self.budget), prog_bar=True)
        for policy, values in results.items():
            if policy != "learned":
                self.log(f"{split}/{policy}/{self.metric_name}", values.get(self.metric_name, float("nan")))
                self.log(f"{split}/{policy}/fraction", values["token_fraction_mean"])
        if not self.evaluates_baselines():  # the summary is written at the end of fit, validate and test
            return
        trained = self.deployed_policy
        if trained != "learned":  # a dense (pretraining) run deploys the uniform grid
            results = {trained: results.pop("learned"), **results}
        else:
            if self.hparams.policy == "transferred":  # another run's policy
                trained = "transferred"
            elif (
                self.stage != "ppo" or self.algorithm.progress.ppo_steps == 0
            ):  # no PPO step ran: the policy only imitated
                trained = "imitation"
            else:  # SPLIT, or its multi-task policy (`learned_name`)
                trained = self.learned_name
            if trained != "learned":
                results = {
                    k.replace("learned", trained, 1) if k.startswith("learned") else k: v
                    for k, v in results.items()
                }
        record = summary_record(
            self.task_name,
            self.metric_name,
            self.budget,
            self.controller.value_at(self.budget),
            results,
            str(self.trainer.state.fn.value),
            trained_policy=trained,
            columns=self.logic.summary_columns(),
        )
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir
        if self.trainer.is_global_zero:
            write_summary(record, log_dir)
            rank_zero_info("\n" + format_table(record))

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def predict_step(
        self, batch: Any, batch_idx: int, outputs: Any = None, layout: Any = None
    ) -> list[dict[str, Any]]:
        """Each image's source (dataset index and file), layout (token boxes in pixels, levels,
        fraction) and prediction (``outputs`` and ``layout`` when the caller already computed them).
        A batch whose files were all unusable is None: no rows."""
        if batch is None:
            return []
        sequence = isinstance(batch, list | tuple)
        images, targets = self.unpack_batch(batch) if sequence else (batch, None)
        if layout is None:
            outputs, layout = self(images, seed=batch_idx)
        # the data module's collate appends the sources last (after the boxes of classification data)
        sources = batch[-1] if sequence and len(batch) > 2 else [{} for _ in range(layout.batch_size)]
        fractions = layout.fraction.tolist()
        records = []
        for i, tokens in enumerate(layout.token_boxes()):
            target = targets[i] if isinstance(targets, list | tuple) else None
            records.append(
                {
                    **sources[i],
                    "batch": batch_idx,
                    "index": i,
                    "token_fraction": fractions[i],
                    "tokens": tokens,
                    "prediction": self.logic.describe_prediction(outputs, i, target),
                }
            )
        return records
