"""The per-image loss contract, for every task: each image's loss depends on that image alone (it is
PPO's reward), so permuting the batch permutes the losses and changing one image changes only its loss.
A batch mean broadcast to every image, or batch statistics leaking across images, fails these tests."""

from __future__ import annotations

import json

import pytest
import torch

from splitlab.tasks import ClassificationTask, DetectionTask, SegmentationTask, VQATask

TINY = {
    "backbone": "vit_tiny_patch16_224",
    "backbone_kwargs": {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
    "tokenizer": {"levels": [32, 16, 8], "decision_dim": 16, "decision_heads": 2},
    "budget": 0.5,
}


def classification():
    task = ClassificationTask(num_classes=4, **TINY)
    return task, torch.randint(0, 4, (4,))


def detection():
    task = DetectionTask(
        num_classes=3,
        pyramid_channels=16,
        pyramid_indices=[1],
        detector={"anchor_sizes": [8, 16, 32, 64], "representation_size": 32},
        **TINY,
    )
    gen = torch.Generator().manual_seed(1)
    targets = []
    for i in range(4):
        xy = torch.rand(2, 2, generator=gen) * 40
        boxes = torch.cat([xy, xy + 8 + torch.rand(2, 2, generator=gen) * 16], 1)
        targets.append(
            {"boxes": boxes, "labels": torch.tensor([1 + i % 3, 1]), "image_id": torch.tensor(100 + i)}
        )
    return task, targets


def segmentation():
    task = SegmentationTask(
        num_classes=5,
        pyramid_channels=16,
        pyramid_indices=[1],
        decode_head={"channels": 16},
        auxiliary_head=None,
        **TINY,
    )
    return task, torch.randint(0, 5, (4, 64, 64))


def vqa(tmp_path):
    from tests.heads.test_vqa import LM, WORDS

    (tmp_path / "vocab.json").write_text(json.dumps(WORDS))
    task = VQATask(lm=LM, lm_tokenizer=str(tmp_path / "vocab.json"), prompt="<image> {question}", **TINY)
    questions = [
        ["what color is it ?"],
        ["what is it ?", "what color is it ?"],
        ["what is it ?"],
        ["what color is it ?"],
    ]
    answers = [["red"], ["blue", "red"], ["blue"], ["red"]]
    return task, [
        {"questions": q, "multiple_choice_answers": a} for q, a in zip(questions, answers, strict=True)
    ]


def pick(targets, order):
    return [targets[i] for i in order] if isinstance(targets, list) else targets[order]


@pytest.mark.parametrize("build", [classification, detection, segmentation, vqa], ids=lambda f: f.__name__)
def test_each_image_loss_depends_on_that_image_alone(build, tmp_path) -> None:
    task, targets = build(tmp_path) if build is vqa else build()
    task.set_stage("ppo")  # the reward's regime: frozen model in eval mode
    task.eval()
    images = torch.randn(4, 3, 64, 64)

    def losses(x, y):
        # the same random state for every call (detection seeds its samplers from it)
        task.sampling.resume(None)
        with torch.no_grad():
            outputs, _ = task(x)
            return task.per_image_loss(outputs, y)

    base = losses(images, targets)
    assert base.shape == (4,) and torch.isfinite(base).all()
    assert base.std() > 0  # different images, different losses
    order = torch.tensor([2, 0, 3, 1])
    assert torch.allclose(losses(images[order], pick(targets, order)), base[order], atol=1e-4)
    changed = images.clone()
    changed[1] = torch.randn(3, 64, 64)
    after = losses(changed, targets)
    assert (after[1] - base[1]).abs() > 1e-6  # a random-init LM reads its image faintly, but it does
    keep = torch.tensor([0, 2, 3])
    assert torch.allclose(after[keep], base[keep], atol=1e-6)


def test_rollouts_of_one_image_share_the_detection_samplers_draws() -> None:
    task, targets = detection()
    task.set_stage("ppo")
    task.eval()
    images = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        outputs, _ = task(torch.cat([images, images]))  # two identical rollouts of the batch
        twice = task.per_image_loss(outputs, targets * 2)
    assert torch.equal(twice[:4], twice[4:])  # same layout, same draws: the same reward


@pytest.mark.parametrize("build", [classification, detection, segmentation, vqa], ids=lambda f: f.__name__)
def test_loss_gains_of_each_task_are_each_images_own_and_the_loss_oracle_meets_the_budget(
    build, tmp_path
) -> None:
    """The ``loss`` labels and the ``loss_oracle`` row read every task through its per-image loss: an
    image's gains do not move when another image changes, and the row runs under validation's
    inference mode at the budget."""
    task, targets = build(tmp_path) if build is vqa else build()
    task.set_stage("ppo")
    task.eval()
    images = torch.randn(4, 3, 64, 64)

    def gains(x):
        return task.loss_gains(x, targets, torch.Generator().manual_seed(0))

    base = gains(images)
    assert [g.shape for g in base] == [(4, 2, 2), (4, 4, 4)] and all(torch.isfinite(g).all() for g in base)
    changed = images.clone()
    changed[1] = torch.randn(3, 64, 64)
    after = gains(changed)
    keep = torch.tensor([0, 2, 3])
    for b, a in zip(base, after, strict=True):
        torch.testing.assert_close(a[keep], b[keep], atol=1e-5, rtol=1e-4)
    batch = (images, targets)
    with torch.inference_mode():
        layout = task.comparison.loss_oracle_layout(images, batch, 0.5, seed=0)
    assert layout.fraction.mean().item() == pytest.approx(0.5, abs=0.05)
