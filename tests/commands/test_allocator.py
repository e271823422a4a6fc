"""`keep_freed_memory`: after it, a forward's activations reuse freed memory instead of faulting in
fresh pages (the CPU time that `splitlab predict` and `splitlab bench` save with it)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# two of timm's ViT-S blocks at batch 32: their MLP activations (38 MiB) are above the largest
# buffer glibc serves from its heap by default, so each forward writes fresh pages
PROGRAM = """
import sys, torch
from timm.models.vision_transformer import Block
from splitlab.commands.allocator import keep_freed_memory, minor_page_faults
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
blocks = torch.nn.Sequential(Block(384, 6), Block(384, 6)).eval()
x = torch.randn(32, 197, 384)
with torch.inference_mode():
    for _ in range(3):
        blocks(x)
    before = minor_page_faults()
    for _ in range(3):
        blocks(x)
print(kept, minor_page_faults() - before)
"""


def faults(mode: str) -> tuple[bool, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=300, check=True
    )
    kept, count = done.stdout.split()
    return kept == "True", int(count)


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)
def test_kept_memory_is_reused_instead_of_faulted_in() -> None:
    kept, with_keep = faults("keep")
    not_kept, by_default = faults("system")
    assert kept and not not_kept
    assert by_default >= 10_000, by_default  # three forwards' fresh activations (113-170 thousand here)
    # glibc 2.36 cannot always reuse a freed chunk for an aligned request of its own size, so a
    # forward now and then still takes a fresh buffer: 0-19 thousand here, a sixth at most
    assert with_keep * 3 < by_default, (with_keep, by_default)
