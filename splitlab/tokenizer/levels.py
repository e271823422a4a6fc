"""Quadtree levels: patch sizes from coarse to fine, each half the previous."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Levels:
    """Patch sizes of the quadtree, coarse to fine.

    Level ``k`` cuts the image into ``sizes[k]``-pixel patches; a level-``k`` patch covers
    ``cells(k) x cells(k)`` cells of the finest grid. Validation happens here, once, so every
    module downstream can trust the numbers.

    Attributes:
        sizes: patch sizes in pixels, coarse to fine, e.g. ``(64, 32, 16)``.
    """

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = tuple(int(s) for s in self.sizes)
        object.__setattr__(self, "sizes", sizes)
        if len(sizes) < 1:
            raise ValueError("levels must name at least one patch size, e.g. levels=(64, 32, 16)")
        if any(s <= 0 for s in sizes):
            raise ValueError(f"levels={sizes}: patch sizes must be positive")
        for coarse, fine in zip(sizes, sizes[1:], strict=False):
            if coarse != 2 * fine:
                raise ValueError(
                    f"levels={sizes}: each level must be exactly half the previous one "
                    f"(coarse to fine), but {coarse} is followed by {fine}"
                )

    @classmethod
    def build(cls, sizes: Sequence[int] | Levels, patch_size: int | None = None) -> Levels:
        """Validate ``sizes`` and, when given, that the finest level is the backbone's patch size."""
        levels = sizes if isinstance(sizes, Levels) else cls(tuple(sizes))
        if patch_size is not None and levels.finest != patch_size:
            raise ValueError(
                f"levels={levels.sizes}: the finest level must equal the backbone's patch size "
                f"({patch_size}), got {levels.finest}"
            )
        return levels

    @classmethod
    def default(cls, patch_size: int, img_size: tuple[int, int], max_levels: int = 3) -> Levels:
        """The deepest quadtree (up to ``max_levels``) whose coarsest patch divides the image."""
        depth = 1
        while depth < max_levels:
            coarse = patch_size * 2**depth
            if img_size[0] % coarse or img_size[1] % coarse:
                break
            depth += 1
        if depth == 1:
            raise ValueError(
                f"image size {img_size[0]}x{img_size[1]} is not divisible by {2 * patch_size} (two patches "
                f"of {patch_size}), so no quadtree fits: use an image size divisible by {2 * patch_size}"
            )
        return cls(tuple(patch_size * 2 ** (depth - 1 - k) for k in range(depth)))

    @property
    def num(self) -> int:
        """Number of levels."""
        return len(self.sizes)

    @property
    def finest(self) -> int:
        """Finest patch size, the backbone's."""
        return self.sizes[-1]

    @property
    def coarsest(self) -> int:
        """Coarsest patch size: images must be divisible by it."""
        return self.sizes[0]

    @property
    def min_fraction(self) -> float:
        """Token fraction of the all-coarse layout (nothing split)."""
        return 4.0 ** -(self.num - 1)

    def cells(self, level: int) -> int:
        """Side of a level-``level`` patch in finest-grid cells."""
        return self.sizes[level] // self.finest

    def grid(self, level: int, img_size: tuple[int, int]) -> tuple[int, int]:
        """Patch grid ``(rows, cols)`` of ``level`` on an image of ``img_size``."""
        return img_size[0] // self.sizes[level], img_size[1] // self.sizes[level]

    def check_image(self, img_size: Sequence[int]) -> None:
        """Raise when the image cannot be tiled by the coarsest patch."""
        h, w = int(img_size[0]), int(img_size[1])
        if h % self.coarsest or w % self.coarsest:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the coarsest level ({self.coarsest} px) of "
                f"levels={self.sizes}: resize or crop to a multiple of {self.coarsest}, or drop the coarsest level"
            )

    def check_fraction(self, fraction: float, name: str = "target_fraction") -> float:
        """Raise when ``fraction`` lies outside the reachable range ``[min_fraction, 1]``."""
        fraction = float(fraction)
        if not (self.min_fraction <= fraction <= 1.0):
            raise ValueError(
                f"{name}={fraction} is outside the range levels={self.sizes} can reach: "
                f"[{self.min_fraction:g} (nothing split), 1 (uniform finest grid)]"
            )
        return fraction
