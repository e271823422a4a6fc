"""`SplitMultiTask`: several task heads on one backbone, one tokenizer and one policy.

A team that serves one backbone to several heads wants one layout per image and one backbone pass
that every head reads, not one SPLIT model per head (docs/reuse.md). Each head is the head of its
own task's model (`SplitDetector`, `SplitSegmenter`), built as a *member* that shares this model's
backbone and tokenizer: the member gives the head, its results and its names; this model holds and
saves the shared parts once.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from torch import nn

from splitlab.backbone import PackedFeatures
from splitlab.model.base import SplitModel
from splitlab.model.head_settings import MultiTaskHeadSettings, picked
from splitlab.model.preprocess import Placement
from splitlab.model.tasks import DenseModel

# tasks whose heads read the shared backbone's pyramid (classification's head is the timm model's
# own, and VQA reads one block through a language model: neither shares a backbone pass as these do)
MEMBER_TASKS = ("detection", "segmentation")


class SplitMultiTask(DenseModel):
    """Several heads on one SPLIT backbone: ``model(images)`` returns ``{task name: that head's
    outputs}`` for every image, from one layout and one backbone pass.

    Head settings: `MultiTaskHeadSettings`: a mapping from a task name (``coco``, ``ade20k``) to that
    task's settings: ``task`` (``detection`` or ``segmentation``), its head's settings as its own
    model takes them (`SplitDetector`, `SplitSegmenter`; the task's other settings are not the head's),
    and its ``names``.
    """

    task = "multitask"
    head_settings_class = MultiTaskHeadSettings

    def build_head(self, settings: MultiTaskHeadSettings) -> nn.ModuleDict:
        tasks = settings.tasks
        if not isinstance(tasks, Mapping) or not tasks:
            raise ValueError(
                "tasks: name each task and its head, e.g. {coco: {task: detection, num_classes: 80}, "
                "ade20k: {task: segmentation, num_classes: 150}}"
            )
        # not submodules: each member's head is registered below, the shared parts are this model's
        self.members: dict[str, SplitModel] = {}
        for name, given in tasks.items():
            kind = (given or {}).get("task")
            if kind not in MEMBER_TASKS:
                raise ValueError(f"tasks.{name}.task={kind!r}: expected one of {MEMBER_TASKS}")
            member = SplitModel.registry[kind]
            head = picked(member.head_settings_class, given)  # its head's, of the task's settings
            self.members[name] = member.head_on(self, head, given.get("names"))
        return nn.ModuleDict({name: member.head for name, member in self.members.items()})

    def backbone_indices(self) -> list[int]:
        """Every block some head reads, once: the one backbone pass serves them all."""
        return sorted({i for member in self.members.values() for i in member.backbone_indices()})

    def forward_task(
        self, features: PackedFeatures, images: Mapping[str, Sequence[int]] | None = None
    ) -> dict[str, Any]:
        """Each head's outputs, on every image, or (``images``: task name -> image indices) on the
        images given for it (training: a head reads its own task's images only; a head not named
        runs on none)."""
        order = self.backbone_indices()
        outputs = {}
        for name, member in self.members.items():
            chosen = None if images is None else images.get(name)
            if images is not None and not chosen:
                continue
            blocks = [features.intermediates[order.index(i)] for i in member.backbone_indices()]
            mine = PackedFeatures(features.prefix, features.tokens, blocks, features.layout)
            outputs[name] = member.forward_task(mine if chosen is None else mine.select(chosen))
        return outputs

    def forward_layout(
        self, layout: Any, images: Mapping[str, Sequence[int]] | None = None
    ) -> dict[str, Any]:
        """One backbone pass over ``layout``, then every head (or each on its ``images``)."""
        return self.forward_task(self.backbone(layout, indices=self.backbone_indices()), images)

    def results(self, outputs: dict[str, Any], placements: Sequence[Placement], **kwargs: Any) -> list[dict]:
        """Per image, every task's result under its name (each as its own model gives it)."""
        per_task = {
            name: member.results(outputs[name], placements, **kwargs) for name, member in self.members.items()
        }
        return [{name: rows[i] for name, rows in per_task.items()} for i in range(len(placements))]

    def set_member_data(
        self, name: str, names: Sequence[str] | None, category_ids: Sequence[int] | None
    ) -> None:
        """What a task's data says about its outputs (class names, dataset category ids), kept in the
        config so that a saved model names them."""
        member, tasks = self.members[name], copy.deepcopy(self.head_settings.tasks)
        if names:
            member.names = tasks[name]["names"] = list(names)
        if category_ids:
            member.set_head_settings(replace(member.head_settings, category_ids=list(category_ids)))
            tasks[name]["category_ids"] = list(category_ids)
        self.set_head_settings(replace(self.head_settings, tasks=tasks))
