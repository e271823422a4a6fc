"""``splitlab bench --lm ...``: the VQA path end to end, ViT + projector + the language model's prefill.

In VQA the speed that matters is the language model's: every visual token is a prompt token. The
uniform path is timm's own ``forward_intermediates`` (second-to-last block, no CLS, all 576 tokens
of a 336 px /14 model) through the projector into the LM's prefill; the SPLIT path is the deployed
tokenizer, the packed backbone at the same block, the projector, and a batched prefill of prompts
with each image's own number of visual tokens (left padded). Decoding is not timed: it costs the
same per generated token on both paths, once the prompt is in the cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from splitlab.heads.vqa import VisualProjector, build_language_model, causal_inputs, position_ids

TEXT_TOKENS = 40  # a question and LLaVA's answer instruction, roughly


def language_model(spec: str, device: torch.device) -> torch.nn.Module:
    """``--lm``: a JSON config (random init, e.g. ``{"model_type": "llama", "hidden_size": 4096, ...}``)
    or a hub name / local folder."""
    settings: str | dict[str, Any] = json.loads(spec) if spec.lstrip().startswith("{") else spec
    return build_language_model(settings)[0].to(device).eval()


def prefill(lm: torch.nn.Module, visual: list[Tensor], text: Tensor) -> Tensor:
    """One forward over left-padded prompts ``[visual_i, text]``; the next-token logits of each.

    Visual tokens take the text embeddings' dtype: a hub LM loads in its own (LLaVA-1.5: float16)
    while the projector may run in float32."""
    inputs, mask = causal_inputs([torch.cat([v.to(text.dtype), text]) for v in visual])
    return lm(inputs_embeds=inputs, attention_mask=mask, position_ids=position_ids(mask)).logits[:, -1]


def vqa_paths(
    path: Any, images: Tensor, spec: str
) -> tuple[Callable[[], Any], Callable[[], Any], dict[str, Any]]:
    """The uniform and SPLIT VQA paths on ``images`` and what describes them."""
    backbone, device = path.backbone, images.device
    lm = language_model(spec, device)
    width = lm.get_input_embeddings().embedding_dim
    projector = VisualProjector(backbone.embed_dim, width).to(device).eval()
    block = backbone.depth - 2
    text = lm.get_input_embeddings()(torch.randint(0, lm.config.vocab_size, (TEXT_TOKENS,), device=device))

    def uniform() -> Tensor:
        _, hidden = backbone.model.forward_intermediates(
            images, indices=[block], norm=False, output_fmt="NLC"
        )
        return prefill(lm, list(projector(hidden[0])), text)

    def split() -> Tensor:
        layout = path.layout(images)
        features = backbone(layout, indices=[block]).intermediates[0]
        return prefill(lm, list(projector(features).split(layout.seqlens)), text)

    return uniform, split, {"lm": spec[:200], "lm_width": width, "text_tokens": TEXT_TOKENS}
