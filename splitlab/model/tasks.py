"""The four deployable models: what each task's head is, how it reads the backbone, and how its
outputs become results in the input images' own pixels."""

from __future__ import annotations

import shutil
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from splitlab.backbone import PackedFeatures
from splitlab.heads import DetectionHead, SegmentationHead, SimpleFeaturePyramid, VQAHead
from splitlab.heads.vqa import LanguageBridge, build_language_model, build_tokenizer, with_lora
from splitlab.model.base import SplitModel
from splitlab.model.head_settings import (
    ClassificationHeadSettings,
    DetectionHeadSettings,
    PyramidHeadSettings,
    SegmentationHeadSettings,
    VQAHeadSettings,
)
from splitlab.model.preprocess import Placement, Preprocessing

# timm's poolings that give one vector per image, each run on the image's own packed tokens
POOLS = ("token", "avg", "max", "avgmax", "map", "prr")


class SplitClassifier(SplitModel):
    """Classification with the timm model's own head (class token, mean or max pool, SigLIP's attention
    pool, DeiT's two distilled heads), on each image's own tokens.

    Head settings: `ClassificationHeadSettings`.
    """

    task = "classification"
    head_settings_class = ClassificationHeadSettings
    square_input = False  # timm's crop transform takes any (height, width)

    def build_head(self, settings: ClassificationHeadSettings) -> None:
        model = self.backbone.model
        pool = settings.global_pool or model.global_pool
        if pool not in POOLS:
            raise ValueError(f"global_pool={pool!r}: expected one of {POOLS} (a vector per image)")
        classes = model.num_classes if settings.num_classes is None else int(settings.num_classes)
        if classes != model.num_classes or pool != model.global_pool:
            try:
                model.reset_classifier(classes, pool)
            except AssertionError as err:  # timm cannot add an attention pool or distilled head later
                raise ValueError(
                    f"global_pool={pool!r}: the backbone was built with global_pool={model.global_pool!r} "
                    f"and timm cannot change it to {pool!r} ({err}); set backbone_kwargs.global_pool instead"
                ) from None
        if model.num_classes < 1:
            raise ValueError(f"backbone {self.config['backbone']!r} has no classifier: set num_classes")
        return None

    def default_preprocessing(self) -> Preprocessing:
        cfg = self.backbone.data_config
        return Preprocessing(
            self.backbone.img_size,  # (height, width): a classifier's input may be non-square
            tuple(cfg["mean"]),
            tuple(cfg["std"]),
            resize="crop",
            interpolation=cfg.get("interpolation", "bicubic"),
            crop_pct=float(cfg.get("crop_pct", 1.0)),
        )

    @property
    def num_classes(self) -> int:
        return int(self.backbone.model.num_classes)

    def forward_task(self, features: PackedFeatures) -> Tensor:
        return self.backbone.forward_head(features)

    def results(
        self, outputs: Tensor, placements: Sequence[Placement], top_k: int = 5, **_: Any
    ) -> list[dict]:
        probs = outputs.float().softmax(-1)
        values, indices = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        out = []
        for vals, idx in zip(values.tolist(), indices.tolist(), strict=True):
            ranked = [
                {"class": self.name_of(i), "index": i, "probability": v}
                for i, v in zip(idx, vals, strict=True)
            ]
            out.append(
                {"class": ranked[0]["class"], "index": idx[0], "probability": vals[0], "top_k": ranked}
            )
        return out

    def name_of(self, index: int) -> str:
        """The class name of an output index (its number as text where the model has no names)."""
        return self.names[index] if self.names and index < len(self.names) else str(index)


class DenseModel(SplitModel):
    """A model whose head reads a ViTDet-style simple feature pyramid from chosen blocks."""

    def pyramid(self, settings: PyramidHeadSettings) -> SimpleFeaturePyramid:
        return SimpleFeaturePyramid.for_backbone(
            self.backbone, settings.pyramid_channels, settings.pyramid_indices
        )

    def backbone_indices(self) -> list[int]:
        return self.head.pyramid.indices

    def uniform_grids(self, images: Tensor) -> list[Tensor]:
        """timm's own forward on the uniform grid: the head's blocks as ``(B, D, H, W)`` grids, before
        the final norm, as the packed path hands them over (`pyramid_grids`): views of the tokens in
        their own order (channels last). timm's ``NCHW`` copies them to channels first, which made
        the pyramid's convolutions 23% slower on CPU (457 against 370 ms per 1024-px image, ViT-B)
        and would credit SPLIT with a memory format."""
        h, w = (side // self.backbone.patch_size for side in images.shape[-2:])
        tokens = self.backbone.model.forward_intermediates(
            images, indices=self.backbone_indices(), output_fmt="NLC", intermediates_only=True
        )
        return [x.reshape(x.shape[0], h, w, x.shape[-1]).permute(0, 3, 1, 2) for x in tokens]

    def forward_uniform(self, images: Tensor) -> Any:
        """The same model on timm's uniform grid, with no tokenizer: what SPLIT replaces, and what
        ``splitlab bench --task`` measures it against (equal to every patch at the finest level)."""
        pyramid = self.head.pyramid(self.uniform_grids(images))
        return self.head.from_pyramid(pyramid, tuple(images.shape[-2:]))


class SplitDetector(DenseModel):
    """Detection: feature pyramid + torchvision's Faster / Mask R-CNN heads (`DetectionHead`).

    Head settings: `DetectionHeadSettings`. ``names[k - 1]`` names label k (0 is torchvision's
    background).
    """

    task = "detection"
    head_settings_class = DetectionHeadSettings
    head_settings: DetectionHeadSettings

    def build_head(self, settings: DetectionHeadSettings) -> DetectionHead:
        patch = self.backbone.patch_size
        if patch & (patch - 1):
            raise ValueError(
                f"a {patch}-px patch gives pyramid strides {patch / 4:g}-{patch * 2:g} px, but torchvision's "
                "RoIAlign and anchors assume powers of two (boxes would be read 12% off): set "
                "model.init_args.backbone_kwargs.patch_size=16 (timm resamples the patch embedding)"
            )
        return DetectionHead(
            self.pyramid(settings), settings.num_classes, self.backbone.img_size, settings.detector
        )

    def category_id(self, label: int) -> int:
        """The dataset's category id of a label (1..K; 0 is torchvision's background); the label
        itself without a table."""
        ids = self.head_settings.category_ids
        return int(ids[label - 1]) if ids and 0 < label <= len(ids) else int(label)

    def name_of(self, label: int) -> str:
        """The category name of a label (1..K), its number as text where the model has no names."""
        return self.names[label - 1] if self.names and 0 < label <= len(self.names) else str(label)

    def results(self, outputs: dict[str, Any], placements: Sequence[Placement], **_: Any) -> list[dict]:
        return self.finish(self.head.detect(outputs), placements)

    def finish(self, detections: Sequence[dict[str, Tensor]], placements: Sequence[Placement]) -> list[dict]:
        """Detections (`DetectionHead.detect`) in the input images' pixels; a Mask R-CNN's masks pasted
        into the image and encoded as COCO's run-length ``segmentations``."""
        out = []
        for det, place in zip(detections, placements, strict=True):
            labels = det["labels"].tolist()
            record = {
                "boxes": place.boxes_to_input(det["boxes"]).tolist(),
                "scores": det["scores"].float().tolist(),
                "labels": labels,
                "category_ids": [self.category_id(x) for x in labels],
                "names": [self.name_of(x) for x in labels],
            }
            if "masks" in det:
                record["segmentations"] = instance_masks(
                    det["masks"], det["boxes"], place, self.backbone.img_size
                )
            out.append(record)
        return out

    def one_image(self, outputs: dict[str, Any], index: int) -> dict[str, Any]:
        """The outputs of image ``index`` alone."""
        return {
            "features": OrderedDict((k, v[index : index + 1]) for k, v in outputs["features"].items()),
            "image_sizes": outputs["image_sizes"][index : index + 1],
        }


def instance_masks(
    masks: Tensor, boxes: Tensor, place: Placement, network: Sequence[int]
) -> list[dict[str, Any]]:
    """Mask R-CNN's ``(N, 1, 28, 28)`` box masks pasted into the network input (torchvision's
    `paste_masks_in_image`), cut out of the letterbox, resized to the input image, thresholded at 0.5
    and run-length encoded (pycocotools; the ``segmentation`` of a COCO results entry)."""
    import numpy as np
    from pycocotools import mask as coco_mask
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    if masks.shape[0] == 0:
        return []
    pasted = paste_masks_in_image(masks.float(), boxes.float(), tuple(network))[:, 0]
    h, w = place.resized
    region = pasted[:, place.top : place.top + h, place.left : place.left + w]
    if (h, w) != (place.height, place.width):
        region = F.interpolate(region[None], size=(place.height, place.width), mode="bilinear")[0]
    binary = (region > 0.5).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    encoded = coco_mask.encode(np.asfortranarray(binary))
    return [{"size": e["size"], "counts": e["counts"].decode("ascii")} for e in encoded]


class SplitSegmenter(DenseModel):
    """Semantic segmentation: feature pyramid + an mmseg decode head (`SegmentationHead`).

    Head settings: `SegmentationHeadSettings`.
    """

    task = "segmentation"
    head_settings_class = SegmentationHeadSettings

    def build_head(self, settings: SegmentationHeadSettings) -> SegmentationHead:
        return SegmentationHead(
            self.pyramid(settings), settings.num_classes, settings.decode_head, settings.auxiliary_head
        )

    def default_preprocessing(self) -> Preprocessing:
        cfg = self.backbone.data_config
        return Preprocessing(
            self.backbone.img_size[0], tuple(cfg["mean"]), tuple(cfg["std"]), pad_fill="black"
        )

    def results(self, outputs: dict[str, Tensor], placements: Sequence[Placement], **_: Any) -> list[dict]:
        """A label mask per image at the input's own size: logits upsampled to the network input, the
        image's region cut out of the letterbox, resized (bilinear) to the input, then argmax."""
        size = self.backbone.img_size
        logits = F.interpolate(outputs["logits"].float(), size=size, mode="bilinear", align_corners=False)
        out = []
        for row, place in zip(logits, placements, strict=True):
            h, w = place.resized
            region = row[:, place.top : place.top + h, place.left : place.left + w]
            mask = F.interpolate(
                region[None], size=(place.height, place.width), mode="bilinear", align_corners=False
            )[0].argmax(0)
            present = mask.unique().tolist()
            names = [self.names[c] if self.names and c < len(self.names) else str(c) for c in present]
            out.append({"mask": mask, "classes_present": present, "names": names})
        return out


class SplitVQA(SplitModel):
    """VQA, LLaVA-style: one block's tokens (no CLS) in raster order -> projector -> causal LM.

    Head settings: `VQAHeadSettings`.
    """

    task = "vqa"
    head_settings_class = VQAHeadSettings
    head_settings: VQAHeadSettings

    def build_head(self, settings: VQAHeadSettings) -> VQAHead:
        lm = settings.lm
        text = build_tokenizer(settings.lm_tokenizer)
        train_lm = bool(settings.train_lm)
        language, projector = build_language_model(
            lm, vocab_size=len(text), dtype=torch.float32 if train_lm else None
        )
        depth = self.backbone.depth
        block = int(settings.feature_block)
        if not -depth <= block < depth:
            raise ValueError(f"feature_block={block} out of range for a {depth}-block backbone")
        if projector and projector["0.weight"].shape[1] != self.backbone.embed_dim:
            raise ValueError(
                f"lm={lm!r}: its projector reads {projector['0.weight'].shape[1]}-wide features, the backbone "
                f"{self.config['backbone']!r} gives {self.backbone.embed_dim}"
            )
        lora = settings.lora
        if lora is not None and train_lm:
            raise ValueError(
                f"train_lm=True with lora={lora}: choose one (LoRA trains adapters of a frozen LM)"
            )
        language.requires_grad_(train_lm)
        if lora is not None:
            language = with_lora(language, dict(lora))
        bridge = LanguageBridge(language, text, settings.prompt, int(settings.max_new_tokens))
        return VQAHead(
            self.backbone.embed_dim, bridge, settings.token_order, settings.raster_anchor, projector
        )

    def backbone_indices(self) -> list[int]:
        return [int(self.head_settings.feature_block) % self.backbone.depth]

    def forward_task(self, features: PackedFeatures) -> list[Tensor]:
        return self.head.visual_tokens(features.intermediates[0], features.layout)

    def answer(self, outputs: list[Tensor], questions: Sequence[Sequence[str]]) -> list[list[str]]:
        """Greedy answers to each image's questions."""
        return self.head.bridge.answer(outputs, questions)

    def rebuilt_keys(self) -> set[str]:
        """A frozen LM loaded by name or folder comes back identical from there, so saved files leave
        its weights out (LLaVA-1.5-7B: 13 GB); a trained LM, LoRA adapters and an LM built from a
        config (random init) are saved."""
        head = self.head_settings
        if head.train_lm or not isinstance(head.lm, str):
            return set()
        return {f"head.bridge.lm.{k}" for k in self.head.bridge.lm.state_dict() if "lora_" not in k}

    def results(
        self,
        outputs: list[Tensor],
        placements: Sequence[Placement],
        questions: Sequence[Sequence[str]] | None = None,
        **_: Any,
    ) -> list[dict]:
        if questions is None:
            raise ValueError("a VQA model answers questions: pass questions (one list per image)")
        said = self.answer(outputs, questions)
        return [
            {"answers": [{"question": q, "answer": a} for q, a in zip(asked, got, strict=True)]}
            for asked, got in zip(questions, said, strict=True)
        ]

    def save_files(self, directory: Path, config: dict[str, Any]) -> dict[str, Any]:
        """A word-list tokenizer (``vocab.json``) is copied next to the weights."""
        name = config["head"].get("lm_tokenizer", "")
        if isinstance(name, str) and name.endswith(".json") and Path(name).is_file():
            shutil.copyfile(name, directory / "vocab.json")
            config["head"].update(lm_tokenizer="vocab.json", lm_tokenizer_file="vocab.json")
        return config

    @staticmethod
    def resolve_files(config: dict[str, Any], fetch: Any) -> dict[str, Any]:
        head = dict(config.get("head") or {})
        if head.get("lm_tokenizer_file"):
            head["lm_tokenizer"] = fetch(head.pop("lm_tokenizer_file"))
        return {**config, "head": head}
