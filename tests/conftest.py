"""Shared fixtures: tiny random-init backbones and tokenizers, tiny generated datasets (shapes, COCO,
ADE20K; no downloads, CPU).

Helpers that tests import live in `tests.helpers`."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from splitlab.backbone import PackedViT
from splitlab.tokenizer import SplitTokenizer


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny_vit() -> PackedViT:
    """A 2-block, width-64 ViT/16 at 64 px (test_vit shrunk), eval mode."""
    return PackedViT("test_vit", img_size=64, depth=2).eval()


@pytest.fixture
def tiny_tokenizer(tiny_vit: PackedViT) -> SplitTokenizer:
    """Levels (64, 32, 16) on the tiny ViT, with a non-trivial decision module."""
    tok = SplitTokenizer(tiny_vit.embed_dim, (64, 32, 16), decision_dim=32, decision_heads=2).eval()
    torch.nn.init.normal_(tok.decision.mlp.fc2.weight, std=1.0)
    return tok


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory: pytest.TempPathFactory):
    """A tiny generated ImageFolder set (6 train, 3 val, 3 test images per class, 64 px)."""
    from splitlab.data import generate_shapes

    return generate_shapes(tmp_path_factory.mktemp("shapes"), train=6, val=3, test=3, seed=1)


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory: pytest.TempPathFactory):
    """A tiny generated COCO set (4 train, 2 val images, 128 px): copy it before editing it."""
    from splitlab.data import generate_coco

    return generate_coco(tmp_path_factory.mktemp("coco"), img_size=128, train=4, val=2)


@pytest.fixture(scope="module")
def ade_root(tmp_path_factory: pytest.TempPathFactory):
    """A tiny generated ADE20K set (20 train, 2 val images, 128 px): copy it before editing it."""
    from splitlab.data import generate_ade20k

    return generate_ade20k(tmp_path_factory.mktemp("ade"), img_size=128, train=20, val=2)


# The end-to-end twins (a dense stage, then SPLIT training: minutes each) run first, so that under
# `make test`'s two workers (pytest-xdist, whole files per worker) they start at once on different
# workers and the many short tests fill in around them, instead of queueing last on one worker.
LONG_FIRST = (  # longest first (measured under `make test`), so the two workers finish together
    "tests/pipelines/test_detection_pipeline.py",
    "tests/pipelines/test_vqa_pipeline.py",
    "tests/pipelines/test_segmentation_pipeline.py",
    "tests/pipelines/test_regression.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, f in enumerate(LONG_FIRST) if item.nodeid.startswith(f)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the order within each file is kept


@pytest.fixture
def measured(record_property) -> Callable[[str], None]:
    """``measured(text)``: a number a regression test measured, printed in the run's summary (the
    "measured" section at the end: the CI log), also from pytest-xdist's workers, whose output
    pytest does not show."""

    def report(text: str) -> None:
        record_property("measured", text)

    return report


def pytest_terminal_summary(terminalreporter) -> None:
    lines = [
        f"{report.nodeid.split('::')[-1]}: {value}"
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for key, value in getattr(report, "user_properties", ())
        if key == "measured"
    ]
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)
