"""Generators of small datasets in the real formats that `splitlab.data`'s DataModules read.

`shapes`: the classification set (ImageFolder or Hugging Face); `dense_scenes`: multi-object scenes
as COCO instances and ADE20K; `vqa_scenes`: VQAv2-layout scenes and their questions.
"""

from splitlab.data.generators.dense_scenes import generate_ade20k, generate_coco
from splitlab.data.generators.shapes import CLASSES as SHAPE_CLASSES
from splitlab.data.generators.shapes import generate_shapes
from splitlab.data.generators.vqa_scenes import SCENES, generate_vqa

__all__ = [
    "SCENES",
    "SHAPE_CLASSES",
    "generate_ade20k",
    "generate_coco",
    "generate_shapes",
    "generate_vqa",
]
