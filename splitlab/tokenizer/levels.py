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
        """The deepest quadtree (up to ``max_levels``) whose coarsest patch divides the image; where
        not even two patches do (an odd grid such as 27 x 27), the full ``max_levels`` ladder, whose
        coarse patches at the right and bottom edges are clipped to the grid (`grid`)."""
        rows, cols = img_size[0] // patch_size, img_size[1] // patch_size
        if rows < 1 or cols < 1:
            raise ValueError(
                f"image size {img_size[0]}x{img_size[1]} is smaller than one patch of {patch_size} px"
            )
        depth = 1
        while depth < max_levels and not (rows % 2**depth or cols % 2**depth):
            depth += 1
        if depth == 1:
            depth = max_levels
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
        """Coarsest patch size (an image it does not divide gets clipped edge patches: `grid`)."""
        return self.sizes[0]

    @property
    def min_fraction(self) -> float:
        """Token fraction of the all-coarse layout (nothing split) on a grid the coarsest level divides
        (clipped edge patches raise it a little: `min_fraction_on`)."""
        return 4.0 ** -(self.num - 1)

    def min_fraction_on(self, finest: Sequence[int]) -> float:
        """Token fraction of the all-coarse layout on the finest grid ``finest``."""
        rows, cols = self.grid_of(0, finest)
        return rows * cols / (int(finest[0]) * int(finest[1]))

    def cells(self, level: int) -> int:
        """Side of a level-``level`` patch in finest-grid cells."""
        return self.sizes[level] // self.finest

    def finest_grid(self, img_size: Sequence[int]) -> tuple[int, int]:
        """The backbone's patch grid ``(Hf, Wf)`` on an image of ``img_size``: whole patches only, as
        timm's patch embedding (a stride-``finest`` convolution) leaves pixels past the last one out."""
        return int(img_size[0]) // self.finest, int(img_size[1]) // self.finest

    def grid(self, level: int, img_size: Sequence[int]) -> tuple[int, int]:
        """Patch grid ``(rows, cols)`` of ``level`` on an image of ``img_size``.

        Where the level's patch does not divide the finest grid (a 27 x 27 grid under a patch of 4 x 4
        cells), the last row and column hold *clipped* patches: they cover only the cells that exist
        (3 of 4 here), so every finest cell lies under exactly one patch of every level and no patch
        covers a cell the image does not have."""
        return self.grid_of(level, self.finest_grid(img_size))

    def grid_of(self, level: int, finest: Sequence[int]) -> tuple[int, int]:
        """`grid` from the finest grid ``(Hf, Wf)``: ``ceil(Hf / cells(level))`` patches a side."""
        side = self.cells(level)
        return -(-int(finest[0]) // side), -(-int(finest[1]) // side)

    def grids(self, finest: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Every level's grid, coarse to fine, from the finest grid."""
        return tuple(self.grid_of(k, finest) for k in range(self.num))

    def clipped(self, finest: Sequence[int]) -> bool:
        """Whether the coarsest patch fails to divide the finest grid (edge patches are clipped)."""
        side = self.cells(0)
        return bool(int(finest[0]) % side or int(finest[1]) % side)

    def check_image(self, img_size: Sequence[int]) -> None:
        """Raise when the image holds not even one patch of the finest level."""
        h, w = int(img_size[0]), int(img_size[1])
        if h < self.finest or w < self.finest:
            raise ValueError(
                f"image size {h}x{w} is smaller than one patch of the finest level ({self.finest} px) of "
                f"levels={self.sizes}"
            )

    def check_fraction(self, fraction: float, name: str = "budget") -> float:
        """Raise when ``fraction`` lies outside the reachable range ``[min_fraction, 1]``."""
        fraction = float(fraction)
        if not (self.min_fraction <= fraction <= 1.0):
            raise ValueError(
                f"{name}={fraction} is outside the range levels={self.sizes} can reach: "
                f"[{self.min_fraction:g} (nothing split), 1 (uniform finest grid)]"
            )
        return fraction
