"""What each split is worth to the task loss (`refinement_gains`), its labels (`gain_labels`) and the
``loss`` label source / ``loss_oracle`` row that read them."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

from splitlab.model import SplitModel
from splitlab.tokenizer import Levels, build_layout, fraction_of, gain_labels, leaf_masks, tree_scores
from splitlab.training import autograd_ready, on_finest_grid, patch_sums, per_image_shares, refinement_gains


def tiny_model() -> SplitModel:
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", img_size=64, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4
    )
    return SplitModel.from_timm(vit, levels=[32, 16, 8], budget=0.5).eval()


def grid_loss(model: SplitModel, images: torch.Tensor, labels: torch.Tensor, level: int) -> torch.Tensor:
    """Each image's loss with every finest cell holding its level-``level`` patch's token."""
    with torch.no_grad():
        tokens, _ = model.tokenizer.embed(images, model.backbone)
        spread = on_finest_grid(tokens, model.levels)
        everything = [torch.ones(t.shape[:3], dtype=torch.bool) for t in tokens[:-1]]
        layout = build_layout([*tokens[:-1], spread[level]], everything, model.levels)
        return F.cross_entropy(model.forward_layout(layout), labels, reduction="none")


def test_each_levels_gains_add_up_to_the_loss_change_between_its_two_grids() -> None:
    """Integrated gradients are complete: one image's gains at level k sum to how much its loss falls
    from the level-k grid to the level-k+1 grid; the midpoint rule converges to it."""
    model = tiny_model()
    images, labels = torch.randn(3, 3, 64, 64), torch.tensor([0, 1, 2])

    def loss_of(outputs):
        return F.cross_entropy(outputs, labels, reduction="none")

    exact = [grid_loss(model, images, labels, k) for k in range(3)]
    fine = refinement_gains(model, images, loss_of, steps=32)
    for k in range(2):
        assert fine[k].shape == (3, *model.levels.grid(k, (64, 64)))
        torch.testing.assert_close(fine[k].sum((1, 2)), exact[k] - exact[k + 1], atol=2e-4, rtol=1e-3)
    rough = refinement_gains(model, images, loss_of, steps=1)  # the default: its sign and size
    for k in range(2):
        assert (rough[k].sum((1, 2)) - (exact[k] - exact[k + 1])).abs().max() < 0.15
    assert all(p.grad is None for p in model.parameters())  # only the tokens' path was differentiated


def test_gains_sit_where_the_loss_reads_the_image() -> None:
    """A loss that reads only the top-left quarter's tokens gives every other patch no gain."""
    model = tiny_model()

    def quarter(layout):  # per image: the squared norm of the tokens inside the top-left 4x4 cells
        inside = (layout.boxes[:, 2] <= 4) & (layout.boxes[:, 3] <= 4)
        energy = (layout.tokens.float() ** 2).sum(-1) * inside
        return torch.zeros(layout.batch_size).index_add(0, layout.image_index, energy)

    model.forward_layout = quarter
    gains = refinement_gains(model, torch.randn(2, 3, 64, 64), lambda outputs: outputs)
    assert gains[0][:, 0, 0].abs().min() > 0 and gains[0][:, 0, 1:].abs().max() == 0
    assert gains[0][:, 1:].abs().max() == 0
    assert gains[1][:, :2, :2].abs().min() > 0 and gains[1][:, 2:].abs().max() == 0


def test_tree_scores_raise_a_parent_to_its_best_descendant() -> None:
    coarse = torch.tensor([[[0.5, -1.0], [0.0, 2.0]]])
    mid = torch.zeros(1, 4, 4)
    mid[0, 0, 3] = 3.0  # under the top-right parent, whose own split loses 1.0
    scores = tree_scores([coarse, mid])
    assert scores[0].tolist() == [[[0.5, 3.0], [0.0, 2.0]]]
    assert torch.equal(scores[1], mid)
    clipped = tree_scores([torch.zeros(1, 2, 2), torch.arange(9.0).view(1, 3, 3)])  # a 3x3 child grid
    assert clipped[0].tolist() == [[[4.0, 5.0], [7.0, 8.0]]]


def test_gain_labels_split_the_largest_gains_first_and_meet_the_budget() -> None:
    levels = Levels.build([32, 16, 8])
    torch.manual_seed(1)
    gains = [torch.randn(8, 2, 2), torch.randn(8, 4, 4)]
    for target in (0.25, 0.5, 0.75):
        labels = gain_labels(gains, levels, target, (8, 8))
        assert fraction_of(labels, (8, 8)).mean().item() == pytest.approx(target, abs=0.03)
        _, candidates = leaf_masks(labels, (8, 8, 8))
        scores = tree_scores(gains)
        chosen = [s[lab & c] for s, lab, c in zip(scores, labels, candidates, strict=True)]
        left = [s[~lab & c] for s, lab, c in zip(scores, labels, candidates, strict=True)]
        assert (
            torch.cat(chosen).min() > torch.cat(left).max()
        )  # one cut: every split outranks every patch left


def test_autograd_ready_clones_inference_tensors_only() -> None:
    plain = torch.ones(2)
    with torch.inference_mode():
        frozen = torch.ones(2)
    batch = autograd_ready((frozen, [plain, {"masks": frozen}]))
    assert not batch[0].is_inference() and batch[1][0] is plain and not batch[1][1]["masks"].is_inference()


def test_patch_sums_of_a_clipped_grid() -> None:
    cells = torch.ones(1, 5, 5)
    assert patch_sums(cells, 2).tolist() == [[[4.0, 4.0, 2.0], [4.0, 4.0, 2.0], [2.0, 2.0, 1.0]]]


def test_the_loss_label_source_imitates_the_gains_of_the_tasks_own_loss() -> None:
    """``warm_start.label_source: loss``: the warm start's labels are the cut of `refinement_gains`
    read through the task's per-image loss at the batch's budget, not another source's."""
    from splitlab.tasks import ClassificationTask
    from splitlab.tokenizer import annotation_labels
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, warm_start={"label_source": "loss"}, **TINY).eval()
    torch.manual_seed(0)
    images, labels = torch.randn(6, 3, 64, 64), torch.tensor([0, 1, 2, 3, 0, 1])
    given = task.algorithm.imitation_labels(images, (images, labels), 0.5)

    def loss_of(outputs):
        return F.cross_entropy(outputs.float(), labels, reduction="none")

    expected = gain_labels(
        per_image_shares(refinement_gains(task.model, images, loss_of)), task.levels, 0.5, (8, 8)
    )
    assert all(torch.equal(a, b) for a, b in zip(given, expected, strict=True))
    assert fraction_of(given, (8, 8)).mean().item() == pytest.approx(0.5, abs=0.03)
    cells = torch.zeros(6, 8, 8, dtype=torch.bool)
    other = annotation_labels(cells, task.levels, 0.5)[0]
    assert not all(torch.equal(a, b) for a, b in zip(given, other, strict=True))


def test_per_image_shares_weigh_every_image_alike_and_keep_its_order() -> None:
    gains = [torch.tensor([[[1.0, -1.0]], [[10.0, 30.0]]]), torch.tensor([[[2.0, 0.0]], [[0.0, 60.0]]])]
    shares = per_image_shares(gains)
    totals = sum(s.abs().flatten(1).sum(1) for s in shares)
    torch.testing.assert_close(totals, torch.ones(2))
    assert shares[0][0].tolist() == [[0.25, -0.25]]
    torch.testing.assert_close(shares[1][1], torch.tensor([[0.0, 0.6]]))


def test_fidelity_labels_read_the_models_own_prediction_not_the_targets() -> None:
    """``label_source: fidelity``: the gains of the loss to the finest grid's own prediction (soft
    classes), so the labels do not change with the batch's targets, unlike ``loss`` labels."""
    from splitlab.tasks import ClassificationTask
    from splitlab.training import finest_outputs
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, warm_start={"label_source": "fidelity"}, **TINY).eval()
    torch.manual_seed(0)
    images = torch.randn(6, 3, 64, 64)
    labels, others = torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([3, 3, 0, 1, 2, 2])
    given = task.algorithm.imitation_labels(images, (images, labels), 0.5)
    again = task.algorithm.imitation_labels(images, (images, others), 0.5)
    assert all(torch.equal(a, b) for a, b in zip(given, again, strict=True))

    own = finest_outputs(task.model, images).softmax(-1)

    def divergence(outputs):  # cross-entropy to the own prediction: its KL up to a constant
        return -(own * outputs.float().log_softmax(-1)).sum(-1)

    expected = gain_labels(
        per_image_shares(refinement_gains(task.model, images, divergence)), task.levels, 0.5, (8, 8)
    )
    assert all(torch.equal(a, b) for a, b in zip(given, expected, strict=True))
    assert fraction_of(given, (8, 8)).mean().item() == pytest.approx(0.5, abs=0.03)


def test_segmentations_own_targets_are_its_finest_classes_with_the_padding_kept() -> None:
    from splitlab.tasks import SegmentationTask
    from tests.tasks.test_segmentation import TINY

    task = SegmentationTask(num_classes=4, ignore_index=255, **TINY).eval()
    torch.manual_seed(0)
    images = torch.randn(2, 3, 32, 32)
    masks = torch.randint(0, 4, (2, 32, 32))
    masks[:, 24:] = 255  # letterbox padding
    from splitlab.training import finest_outputs

    reference = finest_outputs(task.model, images)
    own = task.logic.own_targets(reference, masks)
    predicted = task.head.predict_masks(reference, (32, 32))
    assert torch.equal(own[:, :24], predicted[:, :24]) and (own[:, 24:] == 255).all()
    # each pixel's own class is its most likely one: the finest grid's loss to it is the least of any
    to_own, to_masks = (task.logic.per_image_loss(reference, m, None) for m in (own, masks))
    assert (to_own < to_masks).all()


def test_entropy_labels_are_apts_layout_at_the_budget() -> None:
    """``label_source: entropy``: the warm start imitates APT's pixel-entropy splits at the batch's
    budget (no annotations, no model), which PPO then improves on with the task's reward."""
    from splitlab.tasks import ClassificationTask
    from splitlab.tokenizer import baseline_scores
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, warm_start={"label_source": "entropy"}, **TINY).eval()
    torch.manual_seed(0)
    images = torch.rand(6, 3, 64, 64)
    images[:3, :, :32] = 0.5  # flat halves: low entropy, left coarse
    given = task.algorithm.imitation_labels(images, (images, torch.zeros(6, dtype=torch.long)), 0.4)
    mean, std = task.model.preprocessing.mean, task.model.preprocessing.std
    scores, cut = baseline_scores("entropy", images, task.levels, budget=0.4, mean=mean, std=std)
    assert all(torch.equal(a, s > cut) for a, s in zip(given, scores, strict=True))
    assert fraction_of(given, (8, 8)).mean().item() == pytest.approx(0.4, abs=0.05)
    top = given[0][:3, :1].float().mean()  # the coarse row over the flat half
    assert top < given[0][:3, 1:].float().mean()


def test_fidelity_labels_are_refused_at_construction_where_a_task_has_no_own_targets() -> None:
    """A multi-task model has no one prediction of its own to keep: refused when the task is built,
    naming the setting and what to use, not at the first warm-start batch."""
    from splitlab.tasks import MultiTaskSplit
    from tests.tasks.test_multitask import tiny_tasks

    vit = {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
    with pytest.raises(
        ValueError, match="label_source=fidelity: MultiTaskSplit has no .* use label_source=loss"
    ):
        MultiTaskSplit(tasks=tiny_tasks(), backbone_kwargs=vit, warm_start={"label_source": "fidelity"})


def test_fidelity_oracle_row_is_the_fidelity_labels_layout_and_reads_no_target() -> None:
    """The ``fidelity_oracle`` row lays each image out by what the ``fidelity`` labels teach (the splits
    that keep its outputs closest to the finest grid's), so it tells a policy short of its labels from
    labels short of the annotation oracle; it reads no target: other labels, the same layout."""
    from splitlab.tasks import ClassificationTask
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(
        num_classes=4,
        warm_start={"label_source": "fidelity"},
        evaluation={"eval_baselines": ["uniform", "fidelity_oracle"]},
        **TINY,
    ).eval()
    torch.manual_seed(0)
    images = torch.randn(6, 3, 64, 64)
    labels, others = torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([3, 3, 0, 1, 2, 2])
    expected = task.algorithm.imitation_labels(images, (images, labels), 0.4)
    with torch.inference_mode():
        layout = task.comparison.oracle_of("fidelity_oracle", images, (images, labels), 0.4, seed=0)
        again = task.comparison.oracle_of("fidelity_oracle", images, (images, others), 0.4, seed=0)
    assert all(torch.equal(d, e) for d, e in zip(layout.decisions, expected, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(layout.decisions, again.decisions, strict=True))
    assert layout.fraction.mean().item() == pytest.approx(0.4, abs=0.05)


def test_fidelity_oracle_row_is_refused_at_construction_where_a_task_has_no_own_targets() -> None:
    from splitlab.tasks import MultiTaskSplit
    from tests.tasks.test_multitask import tiny_tasks

    vit = {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
    with pytest.raises(
        ValueError, match="eval_baselines includes fidelity_oracle: MultiTaskSplit .* drop it"
    ):
        MultiTaskSplit(
            tasks=tiny_tasks(), backbone_kwargs=vit, evaluation={"eval_baselines": ["fidelity_oracle"]}
        )
