"""Two-stage training end to end on tiny generated data: CLI, stages, freezing, resume, summary."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from splitlab.cli import lightning_main
from tests.helpers import StartWeights, batches_run, fit, probe, schedule_args, tiny_args


def test_fit_then_validate_test_predict(shapes_root, tmp_path) -> None:
    cli = fit(shapes_root, tmp_path, *schedule_args(1, 1))
    assert cli.model.stage == "ppo"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["task"] == "classification" and summary["metric"] == "top1"
    assert summary["budget"] == 0.5
    # the deployed budget's λ, from the controller's saved state: I + k_p e + k_d Δe at the point 0.5
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    hp, point = cli.model.hparams, cli.model.controller.budgets.index(0.5)
    by_hand = max(
        0.0,
        float(saved["controller.integral"][point])
        + hp.controller.gain * float(saved["controller.error"][point])
        + hp.controller.damping * float(saved["controller.change"][point]),
    )
    assert summary["lambda"] == pytest.approx(by_hand, abs=1e-6)
    assert cli.model.controller.total_steps > 0  # which PPO moved
    assert set(summary["policies"]) == {"learned", "uniform", "random", "entropy", "oracle", "loss_oracle"}
    rows = summary["policies"]
    for row in rows.values():
        assert set(row) >= {"metric", "token_fraction_mean", "token_fraction_std", "images_per_second"}
        assert row["images_per_second"] > 0
    assert rows["uniform"]["token_fraction_mean"] == 1.0
    for baseline in ("random", "entropy"):  # evaluated at the learned layout's fraction
        assert rows[baseline]["token_fraction_mean"] == pytest.approx(
            rows["learned"]["token_fraction_mean"], abs=0.1
        )
    logged = [r for r in csv.DictReader((tmp_path / "metrics.csv").open()) if r.get("val/top1")]
    assert float(logged[-1]["val/top1"]) == pytest.approx(
        rows["learned"]["metric"]
    )  # the table is what was logged
    assert sorted(p.name for p in (tmp_path / "token_maps").glob("*.png")) == [
        "budgets_epoch_000.png",  # the budget-conditioned twin: one image at budgets 0.3, 0.5, 0.7
        "budgets_epoch_001.png",
        "epoch_000.png",
        "epoch_001.png",
    ]

    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    for command in ("validate", "test"):
        out = tmp_path / command
        lightning_main([command, *tiny_args(shapes_root, out), f"--ckpt_path={ckpt}"])
        record = json.loads((out / "summary.json").read_text())
        assert record["stage"] == command and record["lambda"] == pytest.approx(summary["lambda"])
        assert set(record["policies"]) == {"learned", "uniform", "random", "entropy", "oracle", "loss_oracle"}
    out = tmp_path / "predict"
    lightning_main(
        ["predict", *tiny_args(shapes_root, out), f"--ckpt_path={ckpt}"]
    )  # the task adds a LayoutWriter
    lines = [json.loads(line) for line in (out / "layouts.jsonl").read_text().splitlines()]
    assert len(lines) == 12  # 3 test images x 4 classes
    assert [rec["dataset_index"] for rec in lines] == list(range(12))  # which image, in dataset order
    files = sorted(str(p) for p in (shapes_root / "test").rglob("*.png"))
    assert [rec["file"] for rec in lines] == files  # the test split (the twin's test_split is absent)
    classes = sorted(d.name for d in (shapes_root / "train").iterdir())
    for rec in lines:
        area = sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1, _ in rec["tokens"])
        assert area == 64 * 64 and rec["token_fraction"] == pytest.approx(len(rec["tokens"]) / 64)
        assert rec["prediction"]["class"] in classes


def test_lightning_predict_leaves_the_fit_alone_and_names_each_file(shapes_root, tmp_path) -> None:
    """Predict with the fit's own logger settings writes into <run>/predict/, never over the fit's files;
    a file that is not an image gets no row (not its neighbour's prediction); a predict_split the data
    does not have is refused."""
    import hashlib
    import shutil

    data = tmp_path / "data"
    shutil.copytree(shapes_root, data)
    bad = next((data / "test").rglob("*.png"))
    bad.write_text("not an image")
    run = tmp_path / "run"
    fit(data, run, *schedule_args(1, 0))

    def digest() -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}

    before = digest()
    ckpt = run / "checkpoints" / "last.ckpt"
    for _ in range(2):  # a second predict does not overwrite the first either
        with pytest.warns(UserWarning, match=f"skipping {bad}"):
            lightning_main(["predict", *tiny_args(data, run), f"--ckpt_path={ckpt}"])
    after = digest()
    assert {k: after[k] for k in before} == before
    for folder in ("predict", "predict-1"):
        lines = [json.loads(line) for line in (run / folder / "layouts.jsonl").read_text().splitlines()]
        assert len(lines) == 11 and str(bad) not in {rec["file"] for rec in lines}
        assert len({rec["file"] for rec in lines}) == 11
    with pytest.raises(FileNotFoundError, match="data.predict_split='nope': no such split"):
        lightning_main(
            ["predict", *tiny_args(data, run), f"--ckpt_path={ckpt}", "--data.init_args.predict_split=nope"]
        )


def test_predict_deploys_the_trained_policy(shapes_root, tmp_path) -> None:
    """Predict uses what validate and test use: after a dense-only run that is the uniform grid,
    not the untrained decision module."""
    fit(shapes_root, tmp_path, *schedule_args(0, 0, dense=1))
    out = tmp_path / "predict"
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    lightning_main(["predict", *tiny_args(shapes_root, out), f"--ckpt_path={ckpt}"])
    lines = [json.loads(line) for line in (out / "layouts.jsonl").read_text().splitlines()]
    assert lines and all(rec["token_fraction"] == 1.0 for rec in lines)


def test_ppo_changes_only_the_policy(shapes_root, tmp_path) -> None:
    cli = fit(shapes_root, tmp_path, *schedule_args(1, 1))
    start = torch.load(next((tmp_path / "checkpoints").glob("epoch=0-*.ckpt")), weights_only=False)[
        "state_dict"
    ]
    end = cli.model.state_dict()
    frozen = [k for k in start if k.startswith(("model.backbone.", "model.tokenizer.embed."))]
    policy = [k for k in start if k.startswith("model.tokenizer.decision.")]
    assert frozen and policy
    assert all(torch.equal(start[k], end[k]) for k in frozen)
    assert any(not torch.equal(start[k], end[k]) for k in policy)
    assert not torch.equal(start["controller.steps"], end["controller.steps"])


@pytest.mark.parametrize(
    ("resume_epoch", "augment"),
    [(0, False), (1, False), (2, False), (0, True)],
    ids=["inside-warm-start", "stage-boundary", "inside-ppo", "augmented"],
)
def test_resume_matches_the_uninterrupted_run(shapes_root, tmp_path, resume_epoch, augment) -> None:
    """Weights, λ and stage as if never stopped; with augmentation on too (each sample's random crop
    and flip are seeded by (seed, epoch, index), not by generators a resume re-seeds)."""
    args = [f"--data.init_args.augment={str(augment).lower()}"]
    if augment:  # a random crop moves the objects: no boxes, the paper's labels
        args += ["--data.init_args.objects=null", "--model.init_args.warm_start.label_source=embedding"]
        args += ['--model.init_args.evaluation.eval_baselines=["uniform","random","entropy"]']
    full = fit(shapes_root, tmp_path / "full", *schedule_args(2, 2), *args)
    ckpt = next((tmp_path / "full" / "checkpoints").glob(f"epoch={resume_epoch}-*.ckpt"))
    also = [probe(tmp_path / "probe")]
    resumed = fit(
        shapes_root, tmp_path / "resumed", *schedule_args(2, 2, also=also), *args, f"--ckpt_path={ckpt}"
    )
    assert batches_run(resumed) == 3 * (3 - resume_epoch)  # it continued: 3 batches an epoch, 4 epochs
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    mismatched = [k for k in a if not torch.allclose(a[k].float(), b[k].float(), atol=1e-6)]
    assert not mismatched, mismatched[:5]
    assert resumed.model.controller.value == pytest.approx(full.model.controller.value)
    assert resumed.model.stage == full.model.stage == "ppo"


@pytest.mark.parametrize(
    ("name", "workers"),
    [("mid-epoch=0-step=4", 0), ("mid-epoch=2-step=16", 0), ("mid-epoch=2-step=16", 1)],
    ids=["mid-warm-start", "mid-ppo", "mid-ppo-with-a-worker"],
)
def test_mid_epoch_resume_continues_at_the_next_sample(shapes_root, tmp_path, name, workers) -> None:
    """The resumed run ends with the uninterrupted run's weights. With DataLoader workers, which draw
    their first indices as Lightning builds the iterator (before the epoch is set), too."""
    # 3 batches per epoch; 2 optimizer steps per batch (warm start: task + policy; PPO: K = 2), so a
    # checkpoint every 4 steps lands after batch 2 of epoch 0 and after batch 2 of epoch 2
    mid = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"every_n_train_steps": 4, "save_top_k": -1, "filename": "mid-{epoch}-{step}"},
    }
    callbacks = [
        {
            "class_path": "splitlab.callbacks.SplitSchedule",
            "init_args": {"warm_start_epochs": 2, "rl_epochs": 2},
        },
        mid,
    ]
    args = [
        "--trainer.max_epochs=4",
        f"--trainer.callbacks={json.dumps(callbacks)}",
        "--model.init_args.evaluation.eval_baselines=[]",
        f"--data.init_args.num_workers={workers}",
    ]
    full = fit(shapes_root, tmp_path / "full", *args)
    ckpt = tmp_path / "full" / "checkpoints" / f"{name}.ckpt"
    state = torch.load(ckpt, weights_only=False)
    assert (
        state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"] == 2
    )  # really mid-epoch
    args[1] = f"--trainer.callbacks={json.dumps([*callbacks, probe(tmp_path / 'probe')])}"
    resumed = fit(shapes_root, tmp_path / "resumed", *args, f"--ckpt_path={ckpt}")
    epoch = int(name.split("epoch=")[1].split("-")[0])
    assert batches_run(resumed) == 12 - (3 * epoch + 2)  # only the batches after the checkpoint
    a, b = full.model.state_dict(), resumed.model.state_dict()
    mismatched = [k for k in a if not torch.allclose(a[k].float(), b[k].float(), atol=1e-6)]
    assert not mismatched, mismatched[:5]
    assert resumed.model.controller.value == pytest.approx(full.model.controller.value)


def test_epochs_above_max_epochs_are_refused(shapes_root, tmp_path) -> None:
    with pytest.raises(
        ValueError,
        match=r"dense_epochs \+ warm_start_epochs \+ rl_epochs = 0 \+ 2 \+ 2 = 4 is above trainer.max_epochs=3",
    ):
        fit(shapes_root, tmp_path, *schedule_args(2, 2), "--trainer.max_epochs=3")


def test_unreachable_budget_is_refused(shapes_root, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"budget=0.05 is outside the range levels=\(32, 16, 8\) can reach"):
        fit(shapes_root, tmp_path, "--model.init_args.budget=0.05")


def test_target_kl_stops_the_policy_epochs_early(shapes_root, tmp_path) -> None:
    def ppo_epochs(out, *extra: str) -> set[float]:
        fit(shapes_root, out, *schedule_args(0, 1), "--model.init_args.evaluation.eval_baselines=[]", *extra)
        rows = csv.DictReader((out / "metrics.csv").open())
        return {float(r["train/ppo_epochs"]) for r in rows if r.get("train/ppo_epochs")}

    assert ppo_epochs(tmp_path / "all") == {2.0}  # tiny_args: ppo.epochs=2
    assert ppo_epochs(tmp_path / "early", "--model.init_args.ppo.target_kl=1e-12") == {1.0}


def test_a_fixed_policy_trains_the_backbone_on_its_own_layouts(shapes_root, tmp_path) -> None:
    """policy: entropy is APT in this pipeline: warm start on entropy layouts, no PPO, its own summary row."""
    cli = fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 1, also=[{"class_path": "tests.helpers.StartWeights"}]),
        "--model.init_args.policy=entropy",
        "--model.init_args.budget_range=null",
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trained_policy"] == "entropy"
    assert set(summary["policies"]) == {
        "entropy",
        "uniform",
        "random",
        "oracle",
        "loss_oracle",
    }  # trained row, baselines
    # APT's fixed cuts come from 24 training images and meet the budget on the 12 validation images
    # only up to sampling noise (its budget varies per image); 600 validation images of the CI twin
    # meet ±0.05 (tests/pipelines/test_regression.py)
    assert summary["policies"]["entropy"]["token_fraction_mean"] == pytest.approx(0.5, abs=0.1)
    start = next(c.weights for c in cli.trainer.callbacks if isinstance(c, StartWeights))
    warmed = torch.load(next((tmp_path / "checkpoints").glob("epoch=0-*.ckpt")), weights_only=False)[
        "state_dict"
    ]
    end = cli.model.state_dict()
    backbone = [k for k in start if k.startswith("model.backbone.model.blocks.")]
    policy = [k for k in start if k.startswith("model.tokenizer.decision.")]
    assert backbone and policy
    assert any(not torch.equal(start[k], warmed[k]) for k in backbone)  # the warm start fine-tuned it
    assert all(torch.equal(start[k], end[k]) for k in policy)  # no decision module was ever trained
    # APT splits at fixed per-level cuts (set from the calibration sample, checkpointed), so each
    # image's layout is its own: alone or in a batch, the same
    model = cli.model.eval()
    assert float(warmed["model.apt_budget"]) == 0.5 and warmed["model.apt_cuts"].gt(0).all()
    assert model.model.apt_ready(0.5)
    images = torch.stack([cli.datamodule.datasets["val"][i][0] for i in range(8)])
    with torch.no_grad():
        together = model.model.layout(images, policy="entropy")
        alone = [model.model.layout(images[i : i + 1], policy="entropy") for i in range(8)]
    assert torch.equal(together.fraction, torch.cat([a.fraction for a in alone]))
    with pytest.raises(ValueError, match="budget_range=\\[0.3, 0.7\\] needs policy='learned'"):
        fit(shapes_root, tmp_path / "bad", "--model.init_args.policy=entropy")


def test_a_resume_on_another_number_of_ranks_is_named() -> None:
    """Each rank's sampling stream and share of a mid-epoch skip belong to the rank count that saved
    them: resuming a 2-rank checkpoint on 1 rank continues, with a warning saying what differs."""
    from splitlab.tasks import ClassificationTask
    from tests.tasks.test_per_image_loss import TINY

    task = ClassificationTask(num_classes=4, **TINY)
    states = [torch.Generator().manual_seed(seed).get_state() for seed in (0, 1)]
    with pytest.warns(UserWarning, match=r"saved by 2 rank\(s\), this run has 1: .*resume on 2 rank\(s\)"):
        task.on_load_checkpoint({"splitlab": {"generators": states, "stage": "ppo"}})
    assert task.stage == "ppo" and torch.equal(task.generator.get_state(), states[0])


def test_the_warm_start_labels_read_a_frozen_copy_of_the_initial_patch_embedding(
    shapes_root, tmp_path, monkeypatch
) -> None:
    """The warm start fine-tunes the backbone's patch embedding; the labels' target does not move with
    it: every step reads the labels from the patch embedding as it was when the warm start began, on
    the content embeddings alone (no children projection, position or level embedding)."""
    import splitlab.training.algorithm as training
    from splitlab.tokenizer import LabelEmbedding, MultiScalePatchEmbed

    read, labelled = [], []
    content, labels = MultiScalePatchEmbed.content, training.warm_start_labels

    def spy_content(self, images, source):
        out = content(self, images, source)
        if isinstance(source, LabelEmbedding):
            read.append((out, {k: v.clone() for k, v in source.patch_embed.state_dict().items()}))
        return out

    def spy_labels(given, *args, **kwargs):
        labelled.append(given)
        return labels(given, *args, **kwargs)

    monkeypatch.setattr(MultiScalePatchEmbed, "content", spy_content)
    monkeypatch.setattr(training, "warm_start_labels", spy_labels)
    cli = fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 0, also=[{"class_path": "tests.helpers.StartWeights"}]),
        "--trainer.limit_train_batches=3",
        "--model.init_args.warm_start.label_source=embedding",
    )
    assert len(labelled) == 3 and all(given is out for given, (out, _) in zip(labelled, read, strict=True))
    start = next(c.weights for c in cli.trainer.callbacks if isinstance(c, StartWeights))
    key = "model.backbone.model.patch_embed.proj.weight"
    for _, weights in read:  # the same weights at every step: those the fit started from
        assert torch.equal(weights["proj.weight"], start[key])
    end = cli.model.state_dict()
    assert not torch.equal(end[key], start[key])  # while the backbone's own moved
    assert torch.equal(end["label_embedding.patch_embed.proj.weight"], start[key])
    assert bool(end["label_embedding.taken"])


def test_a_warm_start_without_fine_tuning_trains_the_decision_module_alone(shapes_root, tmp_path) -> None:
    """``warm_start_finetune: false``: backbone, head and embeddings keep the weights the fit started
    from (and sit in eval mode); the decision module imitates the labels; the task loss is still logged."""
    cli = fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 0, also=[{"class_path": "tests.helpers.StartWeights"}]),
        "--model.init_args.warm_start.finetune=false",
        "--trainer.limit_train_batches=3",
    )
    task = cli.model
    assert task.stage == "warm_start" and task.task_frozen
    assert not any(m.training for m in task.task_modules())
    start = next(c.weights for c in cli.trainer.callbacks if isinstance(c, StartWeights)).items()
    end = task.state_dict()
    moved = {k for k, v in start if v.is_floating_point() and not torch.equal(end[k], v)}
    task_part = ("model.backbone.", "model.head.", "model.tokenizer.embed.")
    assert not {k for k in moved if k.startswith(task_part)}
    assert any(k.startswith("model.tokenizer.decision.") for k in moved)
    logged = [r for r in csv.DictReader((tmp_path / "metrics.csv").open()) if r.get("train/task_loss")]
    assert logged and all(float(r["train/task_loss"]) > 0 for r in logged)


def test_live_labels_follow_the_fine_tuned_patch_embedding(shapes_root, tmp_path, monkeypatch) -> None:
    """``label_target: live`` reads the labels from the backbone being fine-tuned (the earlier
    behaviour, kept to compare); an unknown target is refused naming the setting."""
    from splitlab.backbone import PackedViT
    from splitlab.tokenizer import MultiScalePatchEmbed

    sources = []
    content = MultiScalePatchEmbed.content

    def spy_content(self, images, source):
        sources.append(type(source))
        return content(self, images, source)

    monkeypatch.setattr(MultiScalePatchEmbed, "content", spy_content)
    cli = fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 0),
        "--trainer.limit_train_batches=2",
        "--model.init_args.warm_start.label_target=live",
    )
    # every embedding read, the labels' included, is the live backbone's; no frozen copy is taken
    assert sources and set(sources) == {PackedViT} and not cli.model.label_embedding.ready
    with pytest.raises(ValueError, match=r"label_target='frozen': expected one of \('initial', 'live'\)"):
        fit(shapes_root, tmp_path / "bad", "--model.init_args.warm_start.label_target=frozen")


def test_more_imitation_steps_fit_the_labels_closer_and_leave_the_frozen_model_alone(
    shapes_root, tmp_path
) -> None:
    """``imitation_steps`` re-runs the decision module alone on each warm-start batch: the labels are
    fitted closer, and a warm start that does not fine-tune leaves backbone and head as they were."""

    def warm_start(steps: int):
        out = tmp_path / f"steps{steps}"
        cli = fit(
            shapes_root,
            out,
            *schedule_args(1, 0),
            "--model.init_args.warm_start.finetune=false",
            f"--model.init_args.warm_start.imitation_steps={steps}",
            "--model.init_args.warm_start.label_source=embedding",  # labels that do not draw ties at random
            "--model.init_args.evaluation.eval_baselines=[]",
        )
        rows = [r for r in csv.DictReader((out / "metrics.csv").open()) if r.get("train/imitation")]
        return cli.model, [float(r["train/imitation"]) for r in rows]

    one, bce_one = warm_start(1)
    four, bce_four = warm_start(4)
    assert len(bce_one) == len(bce_four) == 3 and sum(bce_four) < sum(bce_one)
    a, b = one.state_dict(), four.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith("model.backbone."))
    assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith("model.tokenizer.decision."))


def test_ppo_keeps_the_annotation_labels_as_an_anchor(shapes_root, tmp_path) -> None:
    """``label_source: annotations`` with the shapes' object boxes, ``ppo.imitation`` left to its default:
    PPO's updates also fit the oracle's labels (its BCE is logged), and the oracle row is in the summary."""
    fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 1),
        "--data.init_args.objects=objects.json",
        "--model.init_args.warm_start.label_source=annotations",
        '--model.init_args.evaluation.eval_baselines=["uniform","oracle"]',
    )
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [r for r in rows if r.get("train/ppo_epochs") and r.get("train/imitation")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    learned, oracle = summary["policies"]["learned"], summary["policies"]["oracle"]
    assert abs(oracle["token_fraction_mean"] - learned["token_fraction_mean"]) <= 0.03


@pytest.mark.parametrize(
    ("given", "anchored"), [([], False), (["--model.init_args.ppo.imitation=0.5"], True)]
)
def test_estimated_labels_leave_ppo_unanchored_unless_asked(shapes_root, tmp_path, given, anchored) -> None:
    """Embedding-difference labels are estimates: by default PPO runs on the reward alone (the anchor
    held the policy back, docs/oracle.md); an explicit ``ppo.imitation`` still anchors it."""
    fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 1),
        "--data.init_args.objects=null",
        "--model.init_args.warm_start.label_source=embedding",
        '--model.init_args.evaluation.eval_baselines=["uniform"]',
        *given,
    )
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [r for r in rows if r.get("train/ppo_epochs")]
    assert bool([r for r in rows if r.get("train/ppo_epochs") and r.get("train/imitation")]) is anchored


def test_run_callbacks_come_from_the_installed_entry_points_not_an_import(monkeypatch) -> None:
    """tasks/ imports no callback: `run_callbacks` finds splitlab's run callbacks through the
    ``splitlab.run_callbacks`` entry points pyproject.toml declares, and says so where none is installed."""
    import splitlab.tasks.training as training
    from splitlab.callbacks import GracefulStop, SplitSchedule

    added = training.run_callbacks([SplitSchedule(warm_start_epochs=2)], fitting=True)
    kinds = {type(c) for c in added}
    assert GracefulStop in kinds and SplitSchedule not in kinds  # the user's own schedule wins
    monkeypatch.setattr(training, "entry_points", lambda group: [])
    with pytest.warns(UserWarning, match="pip install -e"):
        assert training.run_callbacks([], fitting=True) == []


@pytest.mark.parametrize(
    ("source", "weight"),
    [("annotations", 1.0), ("loss", 1.0), ("fidelity", 1.0), ("embedding", 0.0), ("entropy", 0.0)],
)
def test_ppos_default_anchor_follows_what_the_labels_read(source, weight) -> None:
    """Labels that read the task (annotations, its loss, its own prediction) anchor PPO by default;
    proxies of it (embedding differences, pixel entropy) do not; ``ppo.imitation`` overrides both."""
    from splitlab.tasks import ClassificationTask
    from tests.tasks.test_per_image_loss import TINY

    assert (
        ClassificationTask(
            num_classes=4, warm_start={"label_source": source}, **TINY
        ).algorithm.anchor_weight()
        == weight
    )
    given = ClassificationTask(
        num_classes=4, warm_start={"label_source": source}, ppo={"imitation": 0.3}, **TINY
    )
    assert given.algorithm.anchor_weight() == 0.3
