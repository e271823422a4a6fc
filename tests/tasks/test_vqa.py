"""VQATask's training switches: a frozen LM by default, the whole LM with ``train_lm``, LoRA adapters
of the frozen LM with ``lora`` (peft); PPO freezes all of them."""

from __future__ import annotations

import json

import pytest
import torch

from splitlab.heads.vqa import lora_adapters
from splitlab.tasks import VQATask
from tests.heads.test_vqa import LM, WORDS, tiny_llava
from tests.tasks.test_per_image_loss import TINY


def task_with(tmp_path, **settings) -> VQATask:
    (tmp_path / "vocab.json").write_text(json.dumps(WORDS))
    settings = {"lm": LM, **settings}
    return VQATask(lm_tokenizer=str(tmp_path / "vocab.json"), prompt="<image> {question}", **TINY, **settings)


def trained(task: VQATask) -> set[int]:
    return {id(p) for m in task.task_modules() for p in m.parameters() if p.requires_grad}


def test_lora_trains_adapters_of_the_frozen_lm(tmp_path) -> None:
    pytest.importorskip("peft")
    task = task_with(tmp_path, lora={"r": 4, "lora_alpha": 8, "lora_dropout": 0.1})
    task.set_stage("warm_start")
    lm = task.head.bridge.lm
    adapters = {id(p) for m in lora_adapters(lm) for p in m.parameters()}
    base = {id(p) for n, p in lm.named_parameters() if "lora_" not in n}
    assert adapters and adapters <= trained(task) and not base & trained(task)
    images = torch.randn(2, 3, 64, 64)
    targets = [{"questions": ["what color is it ?"], "multiple_choice_answers": ["red"]}] * 2
    outputs, _ = task(images, policy="uniform")
    task.per_image_loss(outputs, targets).mean().backward()
    grads = {n: p.grad for n, p in lm.named_parameters()}
    assert any(
        g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_A" in n or "lora_B" in n
    )
    assert all(g is None for n, g in grads.items() if "lora_" not in n)
    dropouts = [m for name, m in lm.named_modules() if name.endswith("lora_dropout")]
    task.train()
    assert dropouts and all(m.training for m in dropouts)  # the adapters' dropout is on while they train
    assert not any(m.training for name, m in lm.named_modules() if "lora" not in name)
    task.set_stage("ppo")
    task.train()
    assert not adapters & trained(task) and not any(m.training for m in dropouts)


def test_the_lm_is_frozen_unless_asked(tmp_path) -> None:
    frozen = task_with(tmp_path)
    frozen.set_stage("warm_start")
    lm_params = {id(p) for p in frozen.head.bridge.lm.parameters()}
    assert not lm_params & trained(frozen) and not lora_adapters(frozen.head.bridge.lm)
    full = task_with(tmp_path, train_lm=True)
    full.set_stage("warm_start")
    assert {id(p) for p in full.head.bridge.lm.parameters()} <= trained(full)
    with pytest.raises(ValueError, match="train_lm=True with lora="):
        task_with(tmp_path, train_lm=True, lora={"r": 4})
    pytest.importorskip("peft")
    with pytest.raises(ValueError, match="not peft.LoraConfig settings"):
        task_with(tmp_path, lora={"rank": 4})


def test_a_frozen_lm_loaded_by_name_stays_out_of_checkpoints(tmp_path) -> None:
    """A frozen LM from a folder (or hub name) is rebuilt from there: checkpoints leave its weights out
    and loading (resume, validate, init_checkpoint) fills them back; a trained or from-config LM stays."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    settings = {k: v for k, v in LM.items() if k != "model_type"}
    folder = tmp_path / "lm"
    AutoModelForCausalLM.from_config(
        AutoConfig.for_model("llama", vocab_size=len(WORDS), **settings)
    ).save_pretrained(folder)
    task = task_with(tmp_path, lm=str(folder))
    lm_keys = {k for k in task.state_dict() if k.startswith("model.head.bridge.lm.")}
    assert lm_keys and task.rebuilt_keys() == lm_keys
    with torch.no_grad():
        task.head.projector[0].weight.add_(1.0)  # trained weights must survive the round trip
    checkpoint = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(checkpoint)
    assert not lm_keys & set(checkpoint["state_dict"]) and set(checkpoint["splitlab"]["rebuilt"]) == lm_keys
    file = tmp_path / "task.ckpt"
    torch.save(checkpoint, file)

    fresh = task_with(tmp_path, lm=str(folder))
    loaded = torch.load(file, weights_only=False)
    fresh.on_load_checkpoint(loaded)
    fresh.load_state_dict(loaded["state_dict"], strict=True)
    started = task_with(tmp_path, lm=str(folder), init_checkpoint=str(file))
    for model in (fresh, started):
        for key, value in task.state_dict().items():
            if not key.startswith(
                # the policy's state starts fresh from an init_checkpoint (the labels' embedding
                # is taken when the warm start begins)
                (
                    "model.tokenizer.decision.",
                    "model.tokenizer.operating_points.",
                    "controller.",
                    "label_embedding.",
                )
            ):
                assert torch.equal(model.state_dict()[key], value), key

    # An LM fine-tuned in an earlier stage (train_lm) and then frozen: the folder cannot rebuild it,
    # so its weights come from init_checkpoint and are saved from then on (resume keeps them).
    tuned = task_with(tmp_path, lm=str(folder), train_lm=True)
    with torch.no_grad():
        tuned.head.bridge.lm.get_input_embeddings().weight.mul_(2.0)
    tuned_file = tmp_path / "tuned.ckpt"
    torch.save({"state_dict": tuned.state_dict()}, tuned_file)
    frozen = task_with(tmp_path, lm=str(folder), init_checkpoint=str(tuned_file))
    again = {"state_dict": frozen.state_dict()}
    frozen.on_save_checkpoint(again)
    assert lm_keys <= set(again["state_dict"]) and not again["splitlab"].get("rebuilt")
    resumed = task_with(tmp_path, lm=str(folder))
    resumed.on_load_checkpoint(again)
    resumed.load_state_dict(again["state_dict"], strict=True)
    for model in (frozen, resumed):
        assert torch.equal(
            model.head.bridge.lm.get_input_embeddings().weight,
            tuned.head.bridge.lm.get_input_embeddings().weight,
        )
    assert resumed.rebuilt.left_out() == set()

    from_config = task_with(tmp_path)  # random init: its LM weights must be saved
    assert not from_config.rebuilt_keys()
    assert not task_with(tmp_path, lm=str(folder), train_lm=True).rebuilt_keys()
    left_out = {
        "state_dict": {},
        "splitlab": {"rebuilt": ["model.head.bridge.lm.model.no_such_layer.weight"]},
    }
    with pytest.raises(ValueError, match="same lm"):
        from_config.on_load_checkpoint(left_out)


def test_a_llava_whose_projector_reads_another_width_is_refused(tmp_path) -> None:
    """LLaVA's projector was trained on its own vision tower's width: under a ViT of another width the
    task refuses to build, naming the LM and both widths (the LM side always matches: the projector
    writes the LM's width)."""
    tiny_llava(tmp_path / "llava", vision_width=48, vocab_size=len(WORDS))
    with pytest.raises(
        ValueError,
        match=r"lm='.*llava': its projector reads 48-wide features, the backbone 'vit_tiny_patch16_224' gives 32",
    ):
        task_with(tmp_path, lm=str(tmp_path / "llava"))


def test_vqas_own_targets_are_the_finest_grids_greedy_answers(tmp_path) -> None:
    """``label_source: fidelity`` on VQA: each question's answer is the one the model gives on the
    finest grid (the loss then reads its NLL), the rest of the target kept; the labels run."""
    from splitlab.tokenizer import fraction_of
    from splitlab.training import finest_outputs

    task = task_with(tmp_path, warm_start={"label_source": "fidelity"}).eval()
    torch.manual_seed(0)
    images = torch.randn(2, 3, 64, 64)
    targets = [
        {
            "questions": ["what color is it ?", "is it red ?"],
            "multiple_choice_answers": ["red", "yes"],
            "answers": [],
        },
        {"questions": ["what color is it ?"], "multiple_choice_answers": ["blue"], "answers": []},
    ]
    with torch.no_grad():
        reference = finest_outputs(task.model, images)
        own = task.logic.own_targets(reference, targets)
        said = task.model.answer(reference, [t["questions"] for t in targets])
    assert [t["multiple_choice_answers"] for t in own] == said and [len(a) for a in said] == [2, 1]
    assert [t["questions"] for t in own] == [t["questions"] for t in targets]
    labels = task.algorithm.imitation_labels(images, (images, targets), 0.5)
    assert fraction_of(labels, (8, 8)).mean().item() == pytest.approx(0.5, abs=0.05)
