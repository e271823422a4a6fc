"""``policy: transferred``: another run's decision module deployed frozen, the backbone fine-tuned on
its layouts, PPO only with ``transfer_finetune``; refused in one line where the runs differ."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import EpochEndWeights, StartWeights, fit, schedule_args

SINGLE = "--model.init_args.budget_range=null"  # the twin trains a budget-conditioned policy


@pytest.fixture(scope="module")
def source_run(shapes_root, tmp_path_factory):
    """A learned single-budget policy (warm start, PPO) of the tiny twin: the run others transfer."""
    folder = tmp_path_factory.mktemp("source")
    cli = fit(shapes_root, folder, *schedule_args(1, 1), SINGLE)
    decision = {k: v.clone() for k, v in cli.model.tokenizer.decision.state_dict().items()}
    return folder, decision


def decision_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    prefix = "model.tokenizer.decision."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def transfer_fit(shapes_root, tmp_path, folder, watcher: str, *extra: str):
    """The tiny twin trained with ``folder``'s policy transferred, ``tests.helpers.<watcher>`` watching."""
    return fit(
        shapes_root,
        tmp_path,
        *schedule_args(1, 1, also=[{"class_path": f"tests.helpers.{watcher}"}]),
        SINGLE,
        "--model.init_args.policy=transferred",
        f"--model.init_args.policy_options.policy_checkpoint={folder}",
        *extra,
    )


def test_a_transferred_policy_is_deployed_frozen_while_the_backbone_fine_tunes(
    source_run, shapes_root, tmp_path
) -> None:
    folder, source_decision = source_run
    cli = transfer_fit(shapes_root, tmp_path, folder, "StartWeights")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trained_policy"] == "transferred"
    assert "transferred" in summary["policies"] and "learned" not in summary["policies"]
    # the cut is fitted on this run's images: the budget holds (12 validation images: sampling noise)
    assert summary["policies"]["transferred"]["token_fraction_mean"] == pytest.approx(0.5, abs=0.1)
    start = next(c.weights for c in cli.trainer.callbacks if isinstance(c, StartWeights))
    end = cli.model.state_dict()
    assert all(torch.equal(v, source_decision[k]) for k, v in decision_of(start).items())  # came over
    assert all(torch.equal(v, source_decision[k]) for k, v in decision_of(end).items())  # stayed frozen
    blocks = [k for k in start if k.startswith("model.backbone.model.blocks.")]
    assert any(not torch.equal(start[k], end[k]) for k in blocks)  # the warm start fine-tuned it
    assert cli.model.model.policy == "learned"  # what it deploys: the decision module decides
    # splitlab compare puts the source's learned row and this run's transferred row side by side
    from splitlab.commands import run

    assert run(["compare", str(folder), str(tmp_path), "--out", str(tmp_path / "compare")]) == 0
    rows = json.loads((tmp_path / "compare" / "compare.json").read_text())["rows"]
    assert [r["trained_policy"] for r in rows][:2] == ["learned", "transferred"]


def test_transfer_finetune_trains_the_transferred_policy_in_ppo_only(
    source_run, shapes_root, tmp_path
) -> None:
    """With a warm start that leaves the task as it is (``warm_start_finetune: false``, the COCO
    twin's), that stage has nothing to train; PPO then fine-tunes the transferred policy."""
    folder, source_decision = source_run
    cli = transfer_fit(
        shapes_root,
        tmp_path,
        folder,
        "EpochEndWeights",
        "--model.init_args.policy_options.transfer_finetune=true",
        "--model.init_args.warm_start.finetune=false",
    )
    warmed = next(c.weights[0] for c in cli.trainer.callbacks if isinstance(c, EpochEndWeights))
    assert all(torch.equal(v, source_decision[k]) for k, v in decision_of(warmed).items())
    end = cli.model.tokenizer.decision.state_dict()
    assert any(not torch.equal(v, source_decision[k]) for k, v in end.items())  # PPO moved it
    assert json.loads((tmp_path / "summary.json").read_text())["trained_policy"] == "transferred"


def test_a_transfer_that_cannot_work_is_refused_naming_both_values(source_run, tmp_path) -> None:
    import splitlab
    from splitlab.tasks import ClassificationTask

    folder, _ = source_run
    cfg = splitlab.load(folder).config
    names = ("levels", "decision_dim", "decision_heads", "decision_context", "decision_features")
    tokenizer = {k: cfg[k] for k in names}
    same = {k: cfg[k] for k in ("backbone", "backbone_kwargs")}
    same.update(tokenizer=tokenizer, num_classes=4, budget=0.5)

    def transferred(source: str) -> dict:
        return {"policy": "transferred", "policy_options": {"policy_checkpoint": source}}

    with pytest.raises(ValueError, match=r"set policy_options.policy_checkpoint to that run's folder"):
        ClassificationTask(**same, policy="transferred")
    with pytest.raises(ValueError, match=r"policy_checkpoint='x' is read by policy: transferred only"):
        ClassificationTask(**same, policy_options={"policy_checkpoint": "x"})
    with pytest.raises(ValueError, match=r"transfer_finetune=true fine-tunes a transferred policy"):
        ClassificationTask(**same, policy_options={"transfer_finetune": True})
    with pytest.raises(FileNotFoundError, match=r"policy_checkpoint='.*nowhere': no such file or folder"):
        ClassificationTask(**same, **transferred(str(tmp_path / "nowhere")))
    task = ClassificationTask(**same, **transferred(str(folder)))  # all match
    assert task.deployed_policy == "learned"
    kwargs = same["backbone_kwargs"]
    mismatches = [
        ({"tokenizer": {**tokenizer, "levels": [16, 8]}}, r"levels \[32, 16, 8\] and this run has \[16, 8\]"),
        (
            {"backbone_kwargs": {**kwargs, "img_size": 128}},
            r"image size \[64, 64\] and this run has \[128, 128\]",
        ),
        (
            {"tokenizer": {**tokenizer, "decision_dim": 2 * cfg["decision_dim"]}},
            rf"decision_dim {cfg['decision_dim']} and this run has",
        ),
        (
            {
                "tokenizer": {
                    **tokenizer,
                    "decision_context": "children"
                    if cfg["decision_context"] != "children"
                    else "descendants",
                }
            },
            "decision_context",
        ),
        (
            {"tokenizer": {**tokenizer, "decision_features": "mlp"}},
            "decision_features 'linear' and this run has 'mlp'",
        ),
    ]
    for change, message in mismatches:
        with pytest.raises(ValueError, match=message):
            ClassificationTask(**{**same, **change}, **transferred(str(folder)))
