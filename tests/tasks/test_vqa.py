"""VQATask's training switches: a frozen LM by default, the whole LM with ``train_lm``, LoRA adapters
of the frozen LM with ``lora`` (peft); PPO freezes all of them."""

from __future__ import annotations

import json

import pytest
import torch

from splitlab.heads.vqa import lora_adapters
from splitlab.tasks import VQATask
from tests.heads.test_vqa import LM, WORDS
from tests.tasks.test_per_image_loss import TINY


def task_with(tmp_path, **settings) -> VQATask:
    (tmp_path / "vocab.json").write_text(json.dumps(WORDS))
    return VQATask(
        lm=LM, tokenizer=str(tmp_path / "vocab.json"), prompt="<image> {question}", **TINY, **settings
    )


def trained(task: VQATask) -> set[int]:
    return {id(p) for m in task.task_modules() for p in m.parameters() if p.requires_grad}


def test_lora_trains_adapters_of_the_frozen_lm(tmp_path) -> None:
    pytest.importorskip("peft")
    task = task_with(tmp_path, lora={"r": 4, "lora_alpha": 8})
    task.set_stage("warm_start")
    lm = task.head.bridge.lm
    adapters = {id(p) for m in lora_adapters(lm) for p in m.parameters()}
    base = {id(p) for n, p in lm.named_parameters() if "lora_" not in n}
    assert adapters and adapters <= trained(task) and not base & trained(task)
    images = torch.randn(2, 3, 64, 64)
    targets = [{"questions": ["what color is it ?"], "multiple_choice_answers": ["red"]}] * 2
    outputs, _ = task(images, policy="uniform")
    task.per_sample_loss(outputs, targets).mean().backward()
    grads = {n: p.grad for n, p in lm.named_parameters()}
    assert any(
        g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_A" in n or "lora_B" in n
    )
    assert all(g is None for n, g in grads.items() if "lora_" not in n)
    task.set_stage("ppo")
    assert not adapters & trained(task)


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
