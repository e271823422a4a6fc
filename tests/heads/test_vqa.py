"""The VQA head: raster order, uniform equivalence of the visual tokens, and the LM bridge with a
variable number of visual tokens per image (batched = alone, left padding for generation)."""

from __future__ import annotations

import json

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.heads.vqa import (
    LLAVA_PROMPT,
    PROMPT,
    SYSTEM_PROMPT,
    LanguageBridge,
    VQAHead,
    build_language_model,
    build_tokenizer,
    token_order,
)
from splitlab.tokenizer import SplitTokenizer
from tests.helpers import layout_of

WORDS = [
    "<pad>",
    "<unk>",
    "<s>",
    "</s>",
    "<image>",
    "user",
    "assistant",
    ":",
    "what",
    "color",
    "is",
    "it",
    "?",
]
WORDS += ["answer", "the", "question", "using", "a", "single", "word", "or", "phrase", ".", "red", "blue"]
LM = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 3,
}


@pytest.fixture
def bridge(tmp_path) -> LanguageBridge:
    (tmp_path / "vocab.json").write_text(json.dumps(WORDS))
    text = build_tokenizer(str(tmp_path / "vocab.json"))
    language, _ = build_language_model(LM, vocab_size=len(text))
    return LanguageBridge(language.eval(), text, max_new_tokens=3)


def test_all_fine_visual_tokens_equal_the_uniform_path(bridge) -> None:
    """Every patch at the finest level: the LM gets timm's tokens of the chosen block, in timm's order."""
    backbone = PackedViT("vit_tiny_patch16_224", img_size=64, depth=3).eval()
    tokenizer = SplitTokenizer(backbone.embed_dim, (32, 16)).eval()
    head = VQAHead(backbone.embed_dim, bridge).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        layout = layout_of("uniform", tokenizer, backbone, x)
        features = backbone(layout, indices=[1])
        visual = head.visual_tokens(features.intermediates[0], layout)
        _, dense = backbone.model.forward_intermediates(x, indices=[1], norm=False, output_fmt="NLC")
    reference = head.projector(dense[0])  # (B, 16, E): patch tokens only, raster order, no CLS
    for i in range(2):
        assert torch.allclose(visual[i], reference[i], atol=1e-5)


def test_raster_order_places_coarse_tokens_at_their_corner_or_centre(tiny_vit) -> None:
    tokenizer = SplitTokenizer(tiny_vit.embed_dim, (64, 32, 16))
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        layout = layout_of(
            "random", tokenizer, tiny_vit, x, budget=0.5, generator=torch.Generator().manual_seed(0)
        )
    for anchor in ("corner", "centre"):
        order = token_order(layout, "raster", anchor)
        boxes, images = layout.boxes[order], layout.image_index[order]
        assert torch.equal(images, layout.image_index)  # images stay in their place
        y, x0 = (
            (boxes[:, 1], boxes[:, 0])
            if anchor == "corner"
            else ((boxes[:, 1] + boxes[:, 3] - 1) // 2, (boxes[:, 0] + boxes[:, 2] - 1) // 2)
        )
        key = y * 4 + x0
        for part in key.split(layout.seqlens):
            assert torch.all(part[1:] >= part[:-1])  # row-major within each image
    assert torch.equal(token_order(layout, "layout"), torch.arange(layout.tokens.shape[0]))
    with pytest.raises(ValueError, match="token_order='spiral'"):
        token_order(layout, "spiral")


def test_a_batch_with_different_visual_token_counts_equals_each_image_alone(bridge) -> None:
    torch.manual_seed(0)
    visual = [torch.randn(5, 32), torch.randn(2, 32), torch.randn(9, 32)]
    questions = [["what color is it ?"], ["what color is it ?", "what is it ?"], ["what is it ?"]]
    answers = [["red"], ["blue", "red"], ["blue"]]
    with torch.no_grad():
        together = bridge.per_image_loss(visual, questions, answers)
        alone = torch.cat(
            [bridge.per_image_loss([v], [q], [a]) for v, q, a in zip(visual, questions, answers, strict=True)]
        )
        assert torch.allclose(together, alone, atol=1e-4)  # padding and position ids change nothing
        said_together = bridge.answer(visual, questions)
        said_alone = [bridge.answer([v], [q])[0] for v, q in zip(visual, questions, strict=True)]
    assert said_together == said_alone and [len(s) for s in said_together] == [1, 2, 1]


def test_the_loss_of_an_image_is_the_mean_over_its_questions(bridge) -> None:
    visual = [torch.randn(4, 32)]
    with torch.no_grad():
        both = bridge.per_image_loss(visual, [["what color is it ?", "what is it ?"]], [["red", "blue"]])
        first = bridge.per_image_loss(visual, [["what color is it ?"]], [["red"]])
        second = bridge.per_image_loss(visual, [["what is it ?"]], [["blue"]])
    assert both.item() == pytest.approx((first.item() + second.item()) / 2, rel=1e-4)


def test_the_question_may_come_before_the_image(bridge) -> None:
    """Questions first lets each visual token see the question (causal attention): the template's
    text on both sides of ``<image>`` is filled in, not only the part after it."""
    first = LanguageBridge(bridge.lm, bridge.tokenizer, template="{question} <image> answer :")
    visual = [torch.randn(3, 32)]
    inputs, mask, labels, _, _ = first.prompts(visual, [["what color is it ?"]], [["red"]])
    ids = bridge.tokenizer("what color is it ?", add_special_tokens=False)["input_ids"]
    text = bridge.lm.get_input_embeddings()(torch.tensor(ids))
    start = len(first.bos)
    assert torch.equal(inputs[0, start : start + len(ids)], text)
    assert torch.equal(inputs[0, start + len(ids) : start + len(ids) + 3], visual[0])
    assert int(mask.sum()) == inputs.shape[1] and int((labels != -100).sum()) == 2  # "red" and </s>


class _LegacySentencePiece:
    """Encodes like a legacy Llama tokenizer: text that starts with a space gets a lone ``▁`` (id 9)."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    words = {"assistant:": 3, "yes": 4, "no": 5}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [9] * text.startswith(" ") + [self.words[w] for w in text.split()]}


def test_answers_are_encoded_as_the_lm_writes_them_after_the_prompt(bridge) -> None:
    legacy = LanguageBridge(bridge.lm, _LegacySentencePiece(), template="<image> {question} assistant:")
    _, _, labels, _, _ = legacy.prompts([torch.randn(2, 32)], [["yes"]], [["no"]])
    assert labels[0][labels[0] != -100].tolist() == [5, 2]  # "no" then </s>, no stray "▁"


def test_prompt_and_vocabulary_refusals(bridge, tmp_path) -> None:
    with pytest.raises(ValueError, match="needs exactly one <image> placeholder"):
        LanguageBridge(bridge.lm, bridge.tokenizer, template="USER: {question} ASSISTANT:")
    with pytest.raises(ValueError, match=r"only \{question\} may be a field"):
        LanguageBridge(bridge.lm, bridge.tokenizer, template="<image> {question} {answer}")
    no_eos = _LegacySentencePiece()
    no_eos.eos_token_id = None
    with pytest.raises(ValueError, match="has no end-of-sequence token"):
        LanguageBridge(bridge.lm, no_eos, template="<image> {question}")
    with pytest.raises(FileNotFoundError, match="no such vocabulary file"):
        build_tokenizer(str(tmp_path / "missing.json"))


# The LLaVA prompt's words as they are written (the word-level tokenizer is case sensitive), then the
# question's and the answer's: ids 0-4 the special tokens, 5-30 the system prompt and "USER :", 31-35 the
# question, 36-43 the instruction and "ASSISTANT", 44 the answer.
LLAVA_WORDS = ["<pad>", "<unk>", "<s>", "</s>", "<image>", "A", "chat", "between", "a", "curious", "user"]
LLAVA_WORDS += ["and", "an", "artificial", "intelligence", "assistant", ".", "The", "gives", "helpful", ","]
LLAVA_WORDS += ["detailed", "polite", "answers", "to", "the", "'", "s", "questions", "USER", ":", "What"]
LLAVA_WORDS += ["color", "is", "it", "?", "Answer", "question", "using", "single", "word", "or", "phrase"]
LLAVA_WORDS += ["ASSISTANT", "red"]


def test_the_llava_prompt_is_llava_15s_vqav2_prompt_token_by_token(tmp_path) -> None:
    """`LLAVA_PROMPT` is what haotian-liu/LLaVA's VQAv2 evaluation sends (llava/eval/model_vqa_loader.py with
    conv vicuna_v1 of llava/conversation.py, SeparatorStyle.TWO): the system prompt, sep " ", then
    "USER: " + "<image>\\n" + the question file's text (the question, "\\nAnswer the question using a single
    word or phrase.") + sep " " + "ASSISTANT:". The LM reads <s>, the text before <image>, the visual
    tokens, the text after it, then (teacher forcing) the answer and </s>: every id written out by hand."""
    question = "What color is it?"
    system = (
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the user's questions."
    )
    turn = "<image>\n" + question + "\n" + "Answer the question using a single word or phrase."
    by_hand = system + " " + "USER: " + turn + " " + "ASSISTANT:"
    assert LLAVA_PROMPT.format(question=question) == by_hand
    assert PROMPT.format(question=question) == "USER: " + turn + " ASSISTANT:" and system == SYSTEM_PROMPT

    (tmp_path / "vocab.json").write_text(json.dumps(LLAVA_WORDS))
    text = build_tokenizer(str(tmp_path / "vocab.json"))
    language, _ = build_language_model(LM, vocab_size=len(text))
    llava = LanguageBridge(language.eval(), text, template=LLAVA_PROMPT)
    assert llava.before == system + " USER: "
    assert llava.after == "\n{question}\nAnswer the question using a single word or phrase. ASSISTANT:"
    bos, eos = [2], [3]
    system_ids = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # A chat ... intelligence assistant .
    # The assistant gives helpful , detailed , and polite answers to the user ' s questions .
    system_ids += [17, 15, 18, 19, 20, 21, 20, 11, 22, 23, 24, 25, 10, 26, 27, 28, 16]
    before = [*bos, *system_ids, 29, 30]  # ... USER :
    after = [31, 32, 33, 34, 35]  # What color is it ?
    after += [36, 25, 37, 38, 8, 39, 40, 41, 42, 16, 43, 30]  # Answer the question ... phrase . ASSISTANT :
    answer = [44, *eos]  # red </s>
    assert 1 not in before + after + answer  # no <unk>: every word of the prompt is in the list
    assert text(llava.before, add_special_tokens=False)["input_ids"] == before[1:]
    assert text(llava.after.format(question=question), add_special_tokens=False)["input_ids"] == after
    visual = torch.randn(3, 32)
    inputs, mask, labels, _, _ = llava.prompts([visual], [[question]], [["red"]])
    embed = language.get_input_embeddings()
    with torch.no_grad():
        expected = torch.cat([embed(torch.tensor(before)), visual, embed(torch.tensor(after + answer))])
    assert (
        inputs.shape[1] == len(before) + 3 + len(after) + len(answer) and int(mask.sum()) == inputs.shape[1]
    )
    assert torch.equal(inputs[0], expected)
    assert labels[0].tolist() == [-100] * (len(before) + 3 + len(after)) + answer  # only "red </s>" is taught
    # without the system prompt (PROMPT): the same turn, <s> then "USER :" right before the image
    plain = LanguageBridge(language.eval(), text)
    inputs, _, _, _, _ = plain.prompts([visual], [[question]], None)
    with torch.no_grad():
        expected = torch.cat([embed(torch.tensor([*bos, 29, 30])), visual, embed(torch.tensor(after))])
    assert torch.equal(inputs[0], expected)


def test_a_checkpoint_keeps_the_prompt_it_was_trained_with(tmp_path) -> None:
    """A task saved with the old default prompt (before LLaVA's "\\n" ahead of "Answer") loads with that
    prompt, as a task and as a deployed model: the template is a hyperparameter and in the model config."""
    import lightning

    from splitlab.model.load import from_checkpoint
    from splitlab.tasks import VQATask
    from tests.tasks.test_per_image_loss import TINY

    old = "USER: <image>\n{question} Answer the question using a single word or phrase. ASSISTANT:"
    (tmp_path / "vocab.json").write_text(json.dumps(WORDS))
    settings = {"lm": LM, "lm_tokenizer": str(tmp_path / "vocab.json"), **TINY}
    task = VQATask(prompt=old, **settings)
    checkpoint = {
        "state_dict": task.state_dict(),
        "hyper_parameters": dict(task.hparams),
        "pytorch-lightning_version": lightning.__version__,
    }
    task.on_save_checkpoint(checkpoint)
    assert checkpoint["splitlab"]["model"]["head"]["prompt"] == old
    file = tmp_path / "old.ckpt"
    torch.save(checkpoint, file)
    loaded = VQATask.load_from_checkpoint(file, weights_only=False)
    model = from_checkpoint(file)
    for bridge in (loaded.head.bridge, model.head.bridge):
        assert (bridge.before, bridge.after) == (
            "USER: ",
            "\n{question} Answer the question using a single word or phrase. ASSISTANT:",
        )
    assert VQATask(**settings).hparams.prompt == PROMPT  # a new task saves today's default explicitly


def tiny_llava(folder, vision_width: int = 32, vocab_size: int = 100):
    """A tiny LLaVA (CLIP tower of ``vision_width``, the 2-layer Llama of `LM`) saved in the Hugging Face
    format at ``folder``, as ``llava-hf/llava-1.5-7b-hf`` is."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=vision_width,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    text = LlamaConfig(**{**LM, "vocab_size": vocab_size, "max_position_embeddings": 64})
    llava = LlavaForConditionalGeneration(
        LlavaConfig(vision_config=vision, text_config=text, image_token_index=vocab_size - 1)
    )
    llava.eval().save_pretrained(folder)
    return llava


def test_a_llava_checkpoint_gives_its_language_model_and_projector(tmp_path) -> None:
    """The paper-scale path (``lm: llava-hf/llava-1.5-7b-hf``) on a tiny LLaVA saved in the Hugging Face
    format: the causal LM computes LLaVA's own logits, the projector weights are LLaVA's."""
    torch.manual_seed(0)
    llava = tiny_llava(tmp_path / "llava")
    language, projector = build_language_model(str(tmp_path / "llava"))
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        assert torch.allclose(language.eval()(input_ids=ids).logits, llava(input_ids=ids).logits, atol=1e-5)
    theirs = llava.model.multi_modal_projector
    assert torch.equal(projector["0.weight"], theirs.linear_1.weight) and projector["0.weight"].shape[1] == 32
    assert torch.equal(projector["2.bias"], theirs.linear_2.bias)
    assert sum(p.numel() for p in language.parameters()) == sum(
        p.numel() for p in [*llava.model.language_model.parameters(), *llava.lm_head.parameters()]
    )


def test_a_llava_onevision_checkpoint_gives_its_qwen2_language_model_and_projector(tmp_path) -> None:
    """The SigLIP recipe's LM (``tasks/vqav2_siglip.yaml``: LLaVA-OneVision) on a tiny one saved in the
    Hugging Face format: a SigLIP tower (not kept: splitlab's timm SigLIP replaces it), a Qwen2 LM."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        Qwen2Config,
        SiglipVisionConfig,
    )

    torch.manual_seed(0)
    vision = SiglipVisionConfig(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    text = Qwen2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=120,
    )  # fmt: skip
    config = LlavaOnevisionConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_index=118,
        video_token_index=119,
    )
    onevision = LlavaOnevisionForConditionalGeneration(config).eval()
    onevision.save_pretrained(tmp_path / "onevision")
    language, projector = build_language_model(str(tmp_path / "onevision"))
    ids = torch.randint(0, 117, (2, 7))
    with torch.no_grad():
        theirs = onevision(input_ids=ids).logits
        assert torch.allclose(language.eval()(input_ids=ids).logits, theirs, atol=1e-5)
    assert projector["0.weight"].shape == (32, 48)  # reads the 48-wide tower's features
    assert torch.equal(projector["2.weight"], onevision.model.multi_modal_projector.linear_2.weight)


def test_a_half_precision_checkpoint_loads_as_saved_or_in_float32_for_training(tmp_path) -> None:
    """LLaVA-1.5 is saved in float16: kept so when frozen (half the memory), float32 when it trains
    (AdamW on float16 weights turns zero-gradient entries into NaN)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(**{**LM, "vocab_size": 50})).half().save_pretrained(tmp_path / "lm")
    frozen, _ = build_language_model(str(tmp_path / "lm"))
    trained, _ = build_language_model(str(tmp_path / "lm"), dtype=torch.float32)
    assert {p.dtype for p in frozen.parameters()} == {torch.float16}
    assert {p.dtype for p in trained.parameters()} == {torch.float32}


def test_the_loss_reads_the_answer_positions_of_the_full_logits(bridge) -> None:
    """Logits are computed for the answer positions only (left padding puts every answer last); the
    loss is the same mean answer-token NLL as from every position's logits, for answers of unequal length."""
    from splitlab.heads.vqa import position_ids

    torch.manual_seed(0)
    visual = [torch.randn(3, 32), torch.randn(6, 32)]
    questions, answers = [["what is it ?"], ["what color is it ?"]], [["red blue red"], ["blue"]]
    with torch.no_grad():
        got = bridge.per_image_loss(visual, questions, answers)
        inputs, mask, labels, _, longest = bridge.prompts(visual, questions, answers)
        full = bridge.lm(inputs_embeds=inputs, attention_mask=mask, position_ids=position_ids(mask)).logits
    assert longest == 4  # three words and the end of sequence
    nll = torch.nn.functional.cross_entropy(full[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none")
    counted = labels[:, 1:] != -100
    assert counted.sum(1).tolist() == [4, 2]
    assert torch.allclose(got, (nll * counted).sum(1) / counted.sum(1), atol=1e-5)
