"""The language side of VQA (LLaVA-style): projector, visual-token order, and the bridge into a causal LM.

Plain PyTorch + Hugging Face ``transformers``: each image's packed visual tokens (any number,
different per image) go through LLaVA-1.5's two-layer GELU projector and are spliced into the
prompt's embeddings at the ``<image>`` placeholder, with an attention mask: batch size > 1 with
variable visual token counts, left padding for generation. No LLaVA processor (it inserts exactly
576 placeholders).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from splitlab.tokenizer import TokenLayout

TOKEN_ORDERS = ("raster", "layout")
# LLaVA-1.5's VQAv2 evaluation (haotian-liu/LLaVA: scripts/v1_5/eval/vqav2.sh, --conv-mode vicuna_v1):
# llava/eval/model_vqa_loader.py writes "<image>\n" + the question file's text ("{question}\nAnswer the
# question using a single word or phrase."), and llava/conversation.py's conv_vicuna_v1 (SeparatorStyle.TWO,
# sep " ") makes it SYSTEM_PROMPT + " " + "USER: " + that + " " + "ASSISTANT:" (nothing after the colon).
SYSTEM_PROMPT = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
PROMPT = "USER: <image>\n{question}\nAnswer the question using a single word or phrase. ASSISTANT:"
# the whole of it, vicuna_v1's system prompt first (tasks/vqav2.yaml)
LLAVA_PROMPT = f"{SYSTEM_PROMPT} {PROMPT}"
IMAGE = "<image>"


class VisualProjector(nn.Sequential):
    """LLaVA-1.5's projector (``mlp2x_gelu``): vision width -> LM width -> LM width."""

    def __init__(self, vision_dim: int, lm_dim: int) -> None:
        super().__init__(nn.Linear(vision_dim, lm_dim), nn.GELU(), nn.Linear(lm_dim, lm_dim))


def check_token_order(order: str) -> None:
    """Refuse a ``token_order`` other than ``raster`` or ``layout``."""
    if order not in TOKEN_ORDERS:
        raise ValueError(f"token_order={order!r}: expected 'raster' or 'layout'")


def token_order(layout: TokenLayout, order: str = "raster", anchor: str = "corner") -> Tensor:
    """Indices that put each image's tokens in ``order``, image after image.

    ``layout`` keeps the layout's own order (coarse level first). ``raster`` sorts each image's
    tokens by the raster position (row-major on the finest grid) of their ``corner`` (top-left
    finest cell) or ``centre`` cell: the order the language model saw in training, which an
    all-finest layout reproduces exactly.
    """
    if order == "layout":
        return torch.arange(layout.tokens.shape[0], device=layout.tokens.device)
    check_token_order(order)
    boxes = layout.boxes
    if anchor == "corner":
        y, x = boxes[:, 1], boxes[:, 0]
    elif anchor == "centre":
        y, x = (boxes[:, 1] + boxes[:, 3] - 1) // 2, (boxes[:, 0] + boxes[:, 2] - 1) // 2
    else:
        raise ValueError(f"raster anchor={anchor!r}: expected 'corner' or 'centre'")
    width = layout.grid_size[1]
    cells = layout.grid_size[0] * width
    key = layout.image_index * cells + y * width + x  # images stay in order, raster within each
    return key.argsort(stable=True)


def left_pad(rows: Sequence[Tensor], value: float = 0) -> Tensor:
    """Rows of different lengths (dim 0) stacked, padded on the left: generation continues every
    row from its last position."""
    length = max(r.shape[0] for r in rows)
    return torch.stack(
        [F.pad(r, (0, 0) * (r.dim() - 1) + (length - r.shape[0], 0), value=value) for r in rows]
    )


def causal_inputs(rows: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Left-padded ``inputs_embeds`` and their ``attention_mask`` for embedding rows ``(L_i, E)``."""
    mask = [torch.ones(r.shape[0], dtype=torch.long, device=r.device) for r in rows]
    return left_pad(rows), left_pad(mask)


def position_ids(mask: Tensor) -> Tensor:
    """Positions counted from each row's first real token, as ``generate`` counts them."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def build_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer: a ``vocab.json`` word list (a word-level tokenizer, for generated
    data, nothing downloaded) or a hub name / local folder (``AutoTokenizer``)."""
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = json.loads(path.read_text())
        word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        word_level.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=word_level,
            pad_token="<pad>",
            unk_token="<unk>",
            bos_token="<s>",
            eos_token="</s>",
        )
    if path.suffix == ".json":
        raise FileNotFoundError(
            f"tokenizer={name!r}: no such vocabulary file; write one from a VQAv2-layout folder with "
            f"`splitlab data vqa-vocab DATA_ROOT --out {name}` (or name a Hugging Face tokenizer)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


# LLaVA checkpoints by model type: each holds ``model.language_model``, ``model.multi_modal_projector``
# (linear_1, GELU, linear_2) and ``lm_head``; only the language model and projector are taken
LLAVA_FAMILIES = {
    "llava": "LlavaForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "llava_onevision": "LlavaOnevisionForConditionalGeneration",
}


def build_language_model(
    lm: str | dict[str, Any], vocab_size: int | None = None, dtype: torch.dtype | None = None
) -> tuple[nn.Module, dict]:
    """A causal LM by hub name or local folder, or built (random init) from a config dict.

    A LLaVA checkpoint (``llava-hf/llava-1.5-7b-hf``, LLaVA-NeXT, LLaVA-OneVision's
    ``llava-hf/llava-onevision-qwen2-7b-ov-hf``: `LLAVA_FAMILIES`) gives its language model; its
    projector's weights come back as the second value (empty otherwise), to load into `VisualProjector`.
    The vision tower is splitlab's (the recipe's timm backbone), so the checkpoint's is not kept.

    Args:
        lm: hub name, local folder or config dict.
        vocab_size: the vocabulary of a config-built LM.
        dtype: the weights' dtype; by default the checkpoint's own (LLaVA-1.5: float16, half the
            memory of a frozen LM). An LM that trains needs float32: AdamW on float16 weights
            turns every zero-gradient entry into NaN (its eps rounds to 0).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(lm, dict):
        settings = dict(lm)
        model_type = settings.pop("model_type", "llama")
        if vocab_size is not None:
            settings.setdefault("vocab_size", vocab_size)
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings)), {}
    config = AutoConfig.from_pretrained(lm)
    weights_dtype = dtype or "auto"
    family = LLAVA_FAMILIES.get(getattr(config, "model_type", ""))
    if family is None:
        return AutoModelForCausalLM.from_pretrained(lm, dtype=weights_dtype), {}
    import transformers

    llava = getattr(transformers, family).from_pretrained(lm, dtype=weights_dtype)
    # The causal-LM shell is built on the meta device and takes LLaVA's own modules, so the 7B
    # weights exist once (not a second float32 copy); the vision tower is freed with `llava`.
    with torch.device("meta"):
        language = AutoModelForCausalLM.from_config(config.text_config)
    language.model, language.lm_head = llava.model.language_model, llava.lm_head
    left = [name for name, t in [*language.named_parameters(), *language.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"lm={lm!r}: LLaVA's language model did not fill the causal-LM shell ({left[:3]})")
    projector = llava.model.multi_modal_projector
    weights = {
        "0.weight": projector.linear_1.weight,
        "0.bias": projector.linear_1.bias,
        "2.weight": projector.linear_2.weight,
        "2.bias": projector.linear_2.bias,
    }
    return language, {k: v.detach().clone() for k, v in weights.items()}


def with_lora(lm: nn.Module, settings: dict[str, Any]) -> nn.Module:
    """``lm`` with LoRA adapters (``peft``): the LM's own weights frozen, only the adapters train.

    ``settings`` are `peft.LoraConfig` arguments (``r``, ``lora_alpha``, ``target_modules``, ...);
    without ``target_modules`` peft picks its default for the model type (Llama: q_proj, v_proj).
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError("lora: needs peft (pip install 'splitlab[lora]')") from err
    try:
        config = LoraConfig(task_type="CAUSAL_LM", **settings)
    except TypeError as err:
        raise ValueError(f"lora={settings}: not peft.LoraConfig settings ({err})") from err
    return get_peft_model(lm, config)


def lora_adapters(lm: nn.Module) -> list[nn.Module]:
    """The LoRA adapters inside ``lm`` (what a LoRA fine-tune trains: their weights, and their dropout
    switched on while they train); empty without LoRA."""
    kinds = ("lora_A", "lora_B", "lora_dropout")
    return [m for name, m in lm.named_modules() if name.rsplit(".", 1)[-1] in kinds]


class LanguageBridge(nn.Module):
    """A causal LM that reads each question's prompt with its image's visual tokens spliced in.

    Args:
        lm: a Hugging Face causal LM.
        tokenizer: its tokenizer.
        template: the prompt, with ``<image>`` where the visual tokens go and ``{question}``: `PROMPT`
            (LLaVA-1.5's VQA turn) or `LLAVA_PROMPT` (with vicuna_v1's system prompt first). The text
            before and after ``<image>`` is encoded apart, ``<s>`` only before it, as LLaVA's
            ``tokenizer_image_token`` does.
        max_new_tokens: longest answer greedy decoding produces.
    """

    def __init__(
        self, lm: nn.Module, tokenizer: Any, template: str = PROMPT, max_new_tokens: int = 8
    ) -> None:
        super().__init__()
        if template.count(IMAGE) != 1 or "{question}" not in template:
            raise ValueError(
                f"prompt={template!r}: the template needs exactly one {IMAGE} placeholder (where the visual "
                "tokens go) and a {question} field"
            )
        try:
            template.format(question="?")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"prompt={template!r}: only {{question}} may be a field ({err!r}); write literal braces as {{{{ }}}}"
            ) from err
        if tokenizer.eos_token_id is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no end-of-sequence token: answers are taught to end "
                "with one and generation stops at it (set tokenizer.eos_token)"
            )
        self.lm, self.tokenizer, self.max_new_tokens = lm, tokenizer, int(max_new_tokens)
        self.before, self.after = template.split(IMAGE)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        self.eos = tokenizer.eos_token_id

    @property
    def hidden_size(self) -> int:
        return int(self.lm.get_input_embeddings().embedding_dim)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _answer_ids(self, after: str, context: list[int], answer: str) -> list[int]:
        """The answer's tokens as the LM writes them after the prompt (``after``, encoded as
        ``context``): encoded in context, then cut off, because SentencePiece tokenizers encode a
        word alone differently (an extra ``▁``)."""
        whole = self._ids(f"{after} {answer}")
        if len(whole) > len(context) and whole[: len(context)] == context:
            return whole[len(context) :]
        return self._ids(" " + answer)  # the prompt's last token merged with the answer: encode apart

    def prompts(
        self,
        visual: Sequence[Tensor],
        questions: Sequence[Sequence[str]],
        answers: Sequence[Sequence[str]] | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
        """Left-padded prompt embeddings of every question, its image's visual tokens spliced in.

        Returns:
            ``inputs_embeds (Q, L, E)``, ``attention_mask (Q, L)``, ``labels (Q, L)`` (-100 except
            the answer tokens), ``owner (Q,)``, the image of each question, and the longest answer
            in tokens (left padding puts every answer in the last that many positions).
        """
        embed = self.lm.get_input_embeddings()
        device, dtype = embed.weight.device, embed.weight.dtype
        rows, targets, owner, longest = [], [], [], 0
        for i, (tokens, asked) in enumerate(zip(visual, questions, strict=True)):
            for j, question in enumerate(asked):
                before = self._ids(self.before.format(question=question))  # the question may come first
                text = self.after.format(question=question)
                after = self._ids(text)
                answer = (
                    self._answer_ids(text, after, answers[i][j]) + [self.eos] if answers is not None else []
                )
                head = torch.tensor(self.bos + before, dtype=torch.long, device=device)
                tail = torch.tensor(after + answer, dtype=torch.long, device=device)
                rows.append(torch.cat([embed(head), tokens.to(dtype), embed(tail)]))
                labels = torch.full((rows[-1].shape[0],), -100, dtype=torch.long, device=device)
                if answer:
                    labels[-len(answer) :] = torch.tensor(answer, device=device)
                    longest = max(longest, len(answer))
                targets.append(labels)
                owner.append(i)
        inputs, mask = causal_inputs(rows)
        return inputs, mask, left_pad(targets, value=-100), torch.tensor(owner, device=device), longest

    def per_image_loss(
        self, visual: Sequence[Tensor], questions: Sequence[Sequence[str]], answers: Sequence[Sequence[str]]
    ) -> Tensor:
        """Each image's loss, ``(B,)``: the mean over its questions of the mean teacher-forced NLL of the
        answer tokens (so an image with many questions does not weigh more)."""
        inputs, mask, labels, owner, longest = self.prompts(visual, questions, answers)
        # Vocabulary logits for the answer positions only: every position of every rollout in float32
        # would take ~10 GB at LLaVA scale (160 prompts x 450 positions x 32k words).
        keep = longest + 1
        logits = self.lm(
            inputs_embeds=inputs, attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=keep
        ).logits.float()
        labels = labels[:, -longest:] if longest else labels[:, :0]
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels, reduction="none")
        counted = (labels != -100).float()
        per_question = (nll * counted).sum(1) / counted.sum(1).clamp(min=1)
        per_image = torch.zeros(len(visual), device=per_question.device).index_add(0, owner, per_question)
        count = torch.zeros(len(visual), device=per_question.device).index_add(
            0, owner, torch.ones_like(per_question)
        )
        return per_image / count.clamp(min=1)

    @torch.no_grad()
    def answer(self, visual: Sequence[Tensor], questions: Sequence[Sequence[str]]) -> list[list[str]]:
        """Greedy answers, batched over every question of every image (left-padded prompts)."""
        inputs, mask, _, owner, _ = self.prompts(visual, questions, None)
        out = self.lm.generate(
            inputs_embeds=inputs,
            attention_mask=mask,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos,
        )
        texts = self.tokenizer.batch_decode(out, skip_special_tokens=True)
        grouped: list[list[str]] = [[] for _ in visual]
        for image, text in zip(owner.tolist(), texts, strict=True):
            grouped[image].append(text.strip())
        return grouped


class VQAHead(nn.Module):
    """Projector + language bridge: packed ViT features -> each image's visual tokens -> answers.

    Args:
        vision_dim: the backbone's width.
        bridge: the language side.
        order: visual-token order (see `token_order`).
        anchor: the cell that places a coarse token in raster order.
        projector: starting projector weights (a LLaVA checkpoint's), if any.
    """

    def __init__(
        self,
        vision_dim: int,
        bridge: LanguageBridge,
        order: str = "raster",
        anchor: str = "corner",
        projector: dict[str, Tensor] | None = None,
    ) -> None:
        super().__init__()
        check_token_order(order)  # when built, not at the first forward
        self.projector = VisualProjector(vision_dim, bridge.hidden_size)
        if projector:
            self.projector.load_state_dict(projector)
        self.bridge, self.order, self.anchor = bridge, order, anchor

    def visual_tokens(self, features: Tensor, layout: TokenLayout) -> list[Tensor]:
        """Per image ``(N_i, E)`` projected visual tokens in the chosen order."""
        index = token_order(layout, self.order, self.anchor)
        projected = self.projector(features.index_select(0, index))
        return list(projected.split(layout.seqlens))
