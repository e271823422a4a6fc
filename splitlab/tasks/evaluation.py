"""How a `SplitTask` is evaluated: `PolicyComparison`, a plain object that lays out and scores the
learned layout beside the baselines (any loop can feed it batches), what the summary calls the trained
policy (`named_rows`) and the records of a prediction (`prediction_records`). When they run, the
logging and the summary file are `splitlab.tasks.hooks.TaskHooks`'."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from splitlab.metrics import PolicyStats, timed
from splitlab.model import SplitModel
from splitlab.tasks.logic import TaskLogic
from splitlab.tasks.settings import ORACLES, EvaluationSettings
from splitlab.tokenizer import TokenLayout, annotation_labels
from splitlab.training import SplitTraining, autograd_ready, gain_split_labels


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
    task's hooks feed it batches (`TaskHooks`), a plain loop can too. ``stores`` holds the
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
                        base = self.oracle_of(policy, images, batch, realised, batch_idx)
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

    def oracle_of(self, policy: str, images: Tensor, batch: Any, budget: float, seed: int) -> TokenLayout:
        """The layout of the oracle row ``policy`` (one of `ORACLES`) at ``budget``."""
        if policy == "oracle":
            return self.oracle_layout(images, batch, budget, seed)
        return self.loss_oracle_layout(images, batch, budget, seed, own=policy == "fidelity_oracle")

    def loss_oracle_layout(
        self, images: Tensor, batch: Any, budget: float, seed: int, own: bool = False
    ) -> TokenLayout:
        """The ``loss_oracle`` row's layout: the splits worth most to this batch's task loss first
        (`refinement_gains`, read through the task's per-image loss), as many as ``budget`` buys. It
        reads the targets through the loss, so it needs no annotations; like ``oracle``, a bound.
        With ``own`` (the ``fidelity_oracle`` row): the splits that keep the outputs closest to the
        model's own on the finest grid, what the ``fidelity`` labels teach. It reads no target: a
        learned policy below it has not learned its labels; it below ``oracle``, the labels fall short
        of the annotations (docs/loss_labels.md)."""
        generator = torch.Generator(images.device).manual_seed(seed)
        with torch.inference_mode(False):  # validation's tensors, as autograd can read them
            plain_images = autograd_ready(images)
            _, targets = self.logic.unpack_batch(autograd_ready(batch))
            gains = self.algorithm.loss_gains(plain_images, targets, generator, own=own)
        levels = self.model.levels
        # the fidelity labels' shares; the loss oracle's raw gains (an image the model gets wrong may
        # take the tokens of one it gets right: a bound, it may)
        decisions = gain_split_labels(
            gains, levels, budget, levels.finest_grid(images.shape[-2:]), shares=own
        )
        scores = [d.float() for d in decisions]
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


def named_rows(
    results: dict[str, dict[str, float]], deployed: str, policy: str, ppo_ran: bool, learned_name: str
) -> tuple[str, dict[str, dict[str, float]]]:
    """What the summary calls the trained policy, and the rows under that name: the uniform grid after
    a dense run, ``transferred`` (another run's policy), ``imitation`` (no PPO step ran), or the
    task's name for a policy PPO trained (``learned``; a multi-task run's ``multitask``)."""
    if deployed != "learned":  # a dense (pretraining) run deploys the uniform grid
        return deployed, {deployed: results.pop("learned"), **results}
    trained = "transferred" if policy == "transferred" else learned_name if ppo_ran else "imitation"
    if trained == "learned":
        return trained, results
    return trained, {
        k.replace("learned", trained, 1) if k.startswith("learned") else k: v for k, v in results.items()
    }


def prediction_records(
    logic: TaskLogic, batch: Any, batch_idx: int, targets: Any, outputs: Any, layout: TokenLayout
) -> list[dict[str, Any]]:
    """Each image's source (dataset index and file), layout (token boxes in pixels, levels, fraction)
    and prediction, as ``lightning predict`` writes them."""
    sequence = isinstance(batch, list | tuple)
    # the data module's collate appends the sources last (after the boxes of classification data)
    sources = batch[-1] if sequence and len(batch) > 2 else [{} for _ in range(layout.batch_size)]
    fractions = layout.fraction.tolist()
    return [
        {
            **sources[i],
            "batch": batch_idx,
            "index": i,
            "token_fraction": fractions[i],
            "tokens": tokens,
            "prediction": logic.describe_prediction(
                outputs, i, targets[i] if isinstance(targets, list | tuple) else None
            ),
        }
        for i, tokens in enumerate(layout.token_boxes())
    ]
