"""`VQATask`: SPLIT visual question answering, LLaVA-style (ViT -> projector -> causal LM), and
`VQALogic`, its own code (loss, answers, metrics)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection

from splitlab.heads.vqa import lora_adapters
from splitlab.metrics import VQAAccuracy
from splitlab.model import SplitVQA
from splitlab.model.head_settings import VQAHeadSettings
from splitlab.tasks.base import SplitTask
from splitlab.tasks.logic import LossInputs, TaskLogic
from splitlab.tokenizer import TokenLayout


@dataclass(frozen=True)
class VQASettings:
    """What VQA's code reads of its task's settings (`VQALogic` says what each is)."""

    question_types: Sequence[str] = ()
    vqa_accuracy_mode: str = "official"


class VQALogic(TaskLogic):
    """VQA's own code: the mean teacher-forced answer-token NLL of each image's questions, greedy
    answers, and the VQA accuracy.

    Args:
        model: the task's `SplitVQA`.
        question_types: question types whose accuracy is reported apart (``vqa_q_<type>``).
        vqa_accuracy_mode: the accuracy's answer normalisation (`splitlab.metrics.vqa_score`).
    """

    task_name = "vqa"
    metric_name = "vqa_accuracy"

    settings_class = VQASettings

    def __init__(self, model: SplitVQA, settings: VQASettings) -> None:
        super().__init__(model, settings)
        self.question_types, self.vqa_accuracy_mode = settings.question_types, settings.vqa_accuracy_mode

    def repeat_targets(self, targets: list[dict[str, Any]], times: int) -> list[dict[str, Any]]:
        return list(targets) * times

    def per_image_loss(
        self, outputs: list[Tensor], targets: list[dict[str, Any]], inputs: LossInputs
    ) -> Tensor:
        questions = [t["questions"] for t in targets]
        answers = [t["multiple_choice_answers"] for t in targets]
        return self.head.bridge.per_image_loss(outputs, questions, answers)

    def build_metrics(self) -> MetricCollection:
        metric = VQAAccuracy(list(self.question_types), mode=self.vqa_accuracy_mode)
        return MetricCollection({"vqa": metric})

    def own_targets(self, reference: list[Tensor], targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The finest grid's greedy answers as each question's answer (the loss reads their NLL)."""
        answers = self.model.answer(reference, [t["questions"] for t in targets])
        return [{**t, "multiple_choice_answers": list(a)} for t, a in zip(targets, answers, strict=True)]

    def finish_outputs(self, outputs: list[Tensor], targets: list[dict[str, Any]]) -> list[list[str]]:
        """The answers (prefill and greedy decoding), inside the evaluation's clock: in VQA the
        language model is where the visual token count costs most."""
        return self.model.answer(outputs, [t["questions"] for t in targets])

    def update_metrics(
        self,
        metrics: MetricCollection,
        outputs: list[list[str]],
        targets: list[dict[str, Any]],
        layout: TokenLayout,
    ) -> None:
        flat = [p for image in outputs for p in image]
        metrics["vqa"].update(
            flat,
            [a for t in targets for a in t["answers"]],
            [a for t in targets for a in t["answer_types"]],
            [q for t in targets for q in t["question_types"]],
        )


class VQATask(SplitTask):
    """VQA: the ViT's tokens from one block (LLaVA: the second-to-last, no CLS), in raster order,
    through LLaVA-1.5's projector into a causal LM (`splitlab.heads.vqa`).

    Questions are grouped by image, so the ViT and the policy run once per image. The per-image
    loss (PPO's reward) is the mean teacher-forced answer-token NLL over that image's questions;
    evaluation decodes greedily and scores with the official VQA accuracy. The LM is frozen unless
    ``train_lm`` (a small LM built from a config, as in CI, has to learn); the warm start fine-tunes
    ViT and projector, PPO only the decision module. The task's own code is `VQALogic`'s.

    Args:
        lm: the language model: a hub name or local folder (a LLaVA checkpoint gives its LM and
            projector), or a config dict (``model_type`` and its settings) for a random-init LM.
        lm_tokenizer: the LM's tokenizer: a hub name / folder, or a ``vocab.json`` word list.
        prompt: the prompt template, with ``<image>`` and ``{question}``: by default LLaVA-1.5's VQA
            turn (`splitlab.heads.vqa.PROMPT`); ``tasks/vqav2.yaml`` puts vicuna_v1's system prompt
            first (`LLAVA_PROMPT`), as LLaVA-1.5's evaluation does. A checkpoint keeps its own.
        feature_block: the ViT block whose tokens become visual tokens (negative: from the end).
        token_order: ``raster`` (default: what the LM was trained on) or ``layout``.
        raster_anchor: the cell that places a coarse token in raster order: ``corner`` or ``centre``.
        max_new_tokens: longest generated answer.
        train_lm: fine-tune the LM too (dense and warm-start stages).
        lora: `peft.LoraConfig` settings (e.g. ``{r: 16, lora_alpha: 32}``) to fine-tune LoRA adapters
            of the frozen LM with the ViT instead (dense and warm-start stages); off by default.
        question_types: question types whose accuracy is reported apart (``vqa_q_<type>``).
        vqa_accuracy_mode: the accuracy's answer normalisation: ``official`` (default: today's
            official script, as the evaluation server), ``2016`` or ``lmms-eval``
            (`splitlab.metrics.vqa_score`).
        **kwargs: `SplitTask` arguments.
    """

    task_name = VQALogic.task_name
    metric_name = VQALogic.metric_name
    model_class = SplitVQA
    logic_class = VQALogic

    def __init__(
        self,
        lm: str | dict[str, Any] = VQAHeadSettings.lm,
        lm_tokenizer: str = VQAHeadSettings.lm_tokenizer,
        prompt: str = VQAHeadSettings.prompt,
        feature_block: int = VQAHeadSettings.feature_block,
        token_order: str = VQAHeadSettings.token_order,
        raster_anchor: str = VQAHeadSettings.raster_anchor,
        max_new_tokens: int = VQAHeadSettings.max_new_tokens,
        train_lm: bool = VQAHeadSettings.train_lm,
        lora: dict[str, Any] | None = VQAHeadSettings.lora,
        question_types: list[str] | tuple[str, ...] = VQASettings.question_types,
        vqa_accuracy_mode: str = VQASettings.vqa_accuracy_mode,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)

    def task_modules(self) -> list[nn.Module]:
        """ViT, embeddings and projector (and the LM with ``train_lm``, its adapters with ``lora``):
        a frozen LM never trains."""
        modules = [self.backbone, self.tokenizer.embed, self.head.projector]
        if self.hparams.train_lm:
            return [*modules, self.head.bridge.lm]
        return [*modules, *lora_adapters(self.head.bridge.lm)]

    def rebuilt_keys(self) -> set[str]:
        """The frozen LM's weights, which checkpoints leave out (`SplitVQA.rebuilt_keys`)."""
        return {f"model.{k}" for k in self.model.rebuilt_keys()}

    def train(self, mode: bool = True) -> VQATask:
        super().train(mode)
        if not self.hparams.train_lm:
            self.head.bridge.lm.eval()  # frozen: no dropout
            if mode and not self.task_frozen:  # but LoRA's adapters train, with their own dropout
                for module in lora_adapters(self.head.bridge.lm):
                    module.train()
        return self

    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Each image's layout (as for every task) and its answers; the official results file
        (``vqa_results.json``: ``[{question_id, answer}]``) is written at the end of predict."""
        if batch is None:
            return []
        images, targets = self.unpack_batch(batch)
        outputs, layout = self(images, seed=batch_idx)
        answers = self.logic.finish_outputs(outputs, targets)
        records = super().predict_step(batch, batch_idx, outputs=outputs, layout=layout)
        for record, target, said in zip(records, targets, answers, strict=True):
            record["prediction"] = [
                {"question_id": int(q), "answer": a}
                for q, a in zip(target["question_ids"], said, strict=True)
            ]
            self._results.extend(record["prediction"])
        return records

    def on_predict_epoch_start(self) -> None:
        self._results: list[dict[str, Any]] = []
        self._results_path = Path(self.trainer.log_dir or self.trainer.default_root_dir) / "vqa_results.json"
        if self.trainer.is_global_zero:  # written at the end: find out now that it can be
            try:
                self._results_path.parent.mkdir(parents=True, exist_ok=True)
                self._results_path.write_text("[]\n")
            except OSError as err:
                raise OSError(
                    f"{self._results_path}: predict cannot write its results file ({err.strerror or err}); "
                    "choose another trainer.default_root_dir or logger save_dir"
                ) from err

    def on_predict_epoch_end(self) -> None:
        """One ``vqa_results.json`` (on rank 0): every rank's answers gathered, sorted by id, each
        question once (Lightning's predict gives ranks unequal shares; a sampler that repeats images
        to even them out would answer some twice)."""
        gathered = [self._results]
        if self.trainer.world_size > 1 and torch.distributed.is_initialized():
            gathered = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, self._results)
        if not self.trainer.is_global_zero:
            return
        answers = {r["question_id"]: r for part in gathered for r in part}
        self._results_path.write_text(json.dumps([answers[q] for q in sorted(answers)]) + "\n")
