"""Does the VQA twin's model learn to read the image? The measurements behind docs/vqa.md, outside Lightning.

Trains on the uniform grid only (no policy), in plain torch, and prints VQA accuracy per question type
every 200 steps:

    python scripts/vqa_grounding.py lm DATA_ROOT --steps 2400        # ViT -> projector -> tiny Llama
    python scripts/vqa_grounding.py lookup DATA_ROOT --steps 1600    # ViT -> colour-query attention
    python scripts/vqa_grounding.py lm DATA_ROOT --only "what pattern" --prompt "{question} <image>"

``lm`` is the twin's model (configs/ci/vqa.yaml sizes); ``lookup`` replaces the language model by the
simplest reader of "what pattern is inside the <colour> square?": the colour's embedding attends once
over the visual tokens, a linear layer names the pattern. DATA_ROOT comes from ``splitlab data vqa``.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
from typing import Any

import timm
import torch
from torch import nn
from torch.utils.data import DataLoader

from splitlab.data.generators.vqa_scenes import COLOURS, PATTERNS
from splitlab.data.vqa import VQAv2Data, collate
from splitlab.heads.vqa import LanguageBridge, VisualProjector, build_language_model, build_tokenizer
from splitlab.metrics import vqa_score

PATTERN_QUESTION = re.compile(r"what pattern is inside the (\w+) square")


def vit(block: int) -> tuple[nn.Module, Any]:
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=4, num_classes=0
    )

    def tokens(images: torch.Tensor) -> torch.Tensor:
        feats = model.forward_intermediates(
            images, indices=[block], intermediates_only=True, output_fmt="NLC"
        )
        return feats[0][:, model.num_prefix_tokens :]

    return model, tokens


def language_run(args: argparse.Namespace, train: DataLoader, val: DataLoader) -> None:
    model, tokens = vit(args.block)
    text = build_tokenizer(f"{args.root}/vocab.json")
    width = args.lm_width
    settings = {
        "model_type": "llama",
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": args.lm_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 512,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }
    lm, _ = build_language_model(settings, vocab_size=len(text))
    bridge, projector = LanguageBridge(lm, text, args.prompt, 4), VisualProjector(128, width)
    params = [*model.parameters(), *lm.parameters(), *projector.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.05)

    keys = ("questions", "multiple_choice_answers", "question_types")

    def visual(images: torch.Tensor) -> list[torch.Tensor]:
        return list(projector(tokens(images)))

    def evaluate() -> tuple[float, dict[str, float]]:
        model.eval()
        lm.eval()
        per: dict[str, list[float]] = collections.defaultdict(list)
        with torch.no_grad():
            for images, targets in val:
                said = bridge.answer(visual(images), [t["questions"] for t in targets])
                for t, answers in zip(targets, said, strict=True):
                    for a, truth, kind in zip(answers, t["answers"], t["question_types"], strict=True):
                        per[kind].append(vqa_score(a, truth))
        model.train()
        lm.train()
        every = [x for v in per.values() for x in v]
        return sum(every) / len(every), {k: sum(v) / len(v) for k, v in per.items()}

    def step(images: torch.Tensor, targets: list[dict[str, Any]]) -> float:
        if args.only:  # train on one question type
            targets = [
                {
                    k: [
                        v
                        for v, kind in zip(t[k], t["question_types"], strict=True)
                        if kind in args.only.split(",")
                    ]
                    for k in keys
                }
                for t in targets
            ]
        questions = [t["questions"] for t in targets]
        answers = [t["multiple_choice_answers"] for t in targets]
        loss = bridge.per_image_loss(visual(images), questions, answers).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    loop(args.steps, train, step, evaluate)


def lookup_run(args: argparse.Namespace, train: DataLoader, val: DataLoader) -> None:
    model, tokens = vit(args.block)
    colours, patterns = list(COLOURS), list(PATTERNS.values())
    query, head = nn.Embedding(len(colours), 128), nn.Linear(128, len(patterns))
    attend = nn.MultiheadAttention(128, 4, batch_first=True)
    params = [*model.parameters(), *query.parameters(), *attend.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.05)

    def pattern_questions(targets: list[dict[str, Any]]) -> tuple[torch.Tensor, ...]:
        image, colour, pattern = [], [], []
        for i, t in enumerate(targets):
            for q, a in zip(t["questions"], t["multiple_choice_answers"], strict=True):
                if m := PATTERN_QUESTION.match(q):
                    image.append(i)
                    colour.append(colours.index(m.group(1)))
                    pattern.append(patterns.index(a))
        return torch.tensor(image), torch.tensor(colour), torch.tensor(pattern)

    def logits(images: torch.Tensor, image: torch.Tensor, colour: torch.Tensor) -> torch.Tensor:
        feats = tokens(images)[image]
        out, _ = attend(query(colour)[:, None], feats, feats)
        return head(out[:, 0])

    def evaluate() -> tuple[float, dict[str, float]]:
        model.eval()
        right = total = 0
        with torch.no_grad():
            for images, targets in val:
                image, colour, pattern = pattern_questions(targets)
                right += int((logits(images, image, colour).argmax(-1) == pattern).sum())
                total += len(pattern)
        model.train()
        return right / total, {"what pattern": right / total}

    def step(images: torch.Tensor, targets: list[dict[str, Any]]) -> float:
        image, colour, pattern = pattern_questions(targets)
        loss = nn.functional.cross_entropy(logits(images, image, colour), pattern)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    loop(args.steps, train, step, evaluate)


def loop(steps: int, train: DataLoader, step: Any, evaluate: Any) -> None:
    done, start = 0, time.time()
    while done < steps:
        for images, targets in train:
            loss = step(images, targets)
            done += 1
            if done % 200 == 0 or done == steps:
                overall, per = evaluate()
                kinds = ", ".join(f"{k} {v:.3f}" for k, v in per.items())
                print(
                    f"step {done}: loss {loss:.3f}, accuracy {overall:.3f} ({kinds}), {time.time() - start:.0f} s"
                )
            if done >= steps:
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reader", choices=["lm", "lookup"])
    parser.add_argument("root", help="a generated VQA folder (splitlab data vqa --out DIR)")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--block", type=int, default=2, help="ViT block whose tokens are read")
    parser.add_argument("--lm-width", type=int, default=64)
    parser.add_argument("--lm-layers", type=int, default=2)
    parser.add_argument("--only", help="train on this question type only (e.g. 'what pattern')")
    parser.add_argument("--prompt", default="<image> {question}")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = VQAv2Data(root=args.root, img_size=64, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    data.setup("fit")
    train = DataLoader(data.datasets["train"], batch_size=16, shuffle=True, collate_fn=collate)
    val = DataLoader(data.datasets["val"], batch_size=50, collate_fn=collate)
    (language_run if args.reader == "lm" else lookup_run)(args, train, val)


if __name__ == "__main__":
    main()
