"""Rotary position embeddings at any token's position, for every timm RoPE a packed sequence can carry.

timm computes a RoPE table for a whole grid: coordinates per cell (an affine function of the cell's
row and column: ``index``, ``pixel`` or ``centered`` grids, rescaled to a reference shape or not),
then sin and cos of coordinate times frequency. A packed layout needs the rotation of each token,
and a coarse token sits at the centre of the cells it covers. Because the coordinates are affine in
the cell index, the coordinate of that centre is the mean of the coordinates of the box's first and
last cell; this module takes the coordinates from timm's own grid builder and the sin / cos from the
module's own frequencies, so that on the uniform grid it reproduces the module exactly.

Every adapter is checked against the module's own ``get_embed`` on the model's grid (`PackedRope.build`
refuses what does not match), so a RoPE variant timm adds later is refused, never silently wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from timm.layers.pos_embed_sincos import freq_bands, pixel_freq_bands
from torch import Tensor, nn

TOLERANCE = 1e-4  # the table check: float32 sin/cos of the same angles agree far below this


class PackedRope:
    """One model's rotary embedding evaluated at token boxes.

    ``at(boxes)`` gives, for tokens covering finest-grid boxes ``(x0, y0, x1, y1)``, what the model's
    RoPE module gives the cells of the uniform grid: ``(T, 2 * dim)`` (sin then cos), or
    ``(depth, heads, T, 2 * head_dim)`` for the per-block, per-head frequencies of mixed RoPE.
    """

    def __init__(
        self,
        rope: nn.Module,
        coords: Callable[[tuple[int, int]], Tensor],
        embed: Callable[[Tensor], Tensor],
        per_block: bool,
        rotate_half: bool,
    ) -> None:
        self.rope, self._coords, self._embed = rope, coords, embed
        self.per_block, self.rotate_half = per_block, rotate_half
        self._tables: dict[tuple[int, int, torch.device], Tensor] = {}  # coordinates per grid and device

    @classmethod
    def build(cls, model: nn.Module, grid: tuple[int, int], name: str) -> PackedRope | None:
        """The adapter of ``model.rope`` (None where the model has no RoPE), checked on ``grid``, or a
        one-line refusal naming why."""
        rope = getattr(model, "rope", None)
        if rope is None:
            return None
        kind = type(rope).__name__
        adapter = _ADAPTERS.get(kind)
        if adapter is None:
            raise ValueError(
                f"model_name={name!r}: its rotary embedding ({kind}) is not supported on packed sequences "
                f"(supported: {', '.join(sorted(_ADAPTERS))})"
            )
        packed = adapter(rope, model)
        packed.check(grid, name)
        return packed

    def coords(self, grid: tuple[int, int], device: torch.device) -> Tensor:
        """``(H, W, 2)`` the module's coordinates of every cell of ``grid``, float64 on ``device`` (built
        once per grid and device: they depend on no weight)."""
        key = (int(grid[0]), int(grid[1]), torch.device(device))
        if key not in self._tables:
            if len(self._tables) >= 16:
                self._tables.clear()
            self._tables[key] = self._coords((key[0], key[1])).double().to(device)
        return self._tables[key]

    def at(self, boxes: Tensor, grid: tuple[int, int]) -> Tensor:
        """The rotation of each token covering ``boxes`` (finest cells, ``(T, 4)``) on ``grid``."""
        table = self.coords(grid, boxes.device)
        x0, y0 = boxes[:, 0].long(), boxes[:, 1].long()
        x1, y1 = boxes[:, 2].long() - 1, boxes[:, 3].long() - 1
        # affine in the cell index: the box centre's coordinate is the mean of its corner cells'
        # (exactly the cell's own for a one-cell box)
        centre = (table[y0, x0] + table[y1, x1]) / 2
        return self._embed(centre.float())

    def check(self, grid: tuple[int, int], name: str) -> None:
        """Refuse a module whose own table on ``grid`` this adapter does not reproduce."""
        rows, cols = grid
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        boxes = torch.stack([xs, ys, xs + 1, ys + 1], -1).reshape(-1, 4)
        try:
            with torch.no_grad():
                mine = self.at(boxes, grid)
                theirs = _own_table(self.rope, grid)
        except (AttributeError, RuntimeError, TypeError, ValueError):  # a module this adapter does not know
            theirs = mine = None
        if (
            theirs is None
            or mine is None
            or theirs.shape != mine.shape
            or (theirs.float() - mine).abs().max() > TOLERANCE
        ):
            raise ValueError(
                f"model_name={name!r}: its rotary embedding ({type(self.rope).__name__}, this configuration) "
                "is not reproduced at token positions, so it is not supported on packed sequences"
            )


def _own_table(rope: nn.Module, grid: tuple[int, int]) -> Tensor | None:
    """The module's own (unaugmented) table on ``grid``."""
    training = rope.training
    rope.eval()
    try:
        return rope.get_embed(shape=list(grid))
    except Exception:  # a module that cannot build another grid: its cached one, if it is this one
        try:
            return rope.get_embed()
        except Exception:
            return None
    finally:
        rope.train(training)


def cell_grid(
    shape: tuple[int, int],
    grid_type: str = "index",
    ref_feat_shape: tuple[int, int] | None = None,
    grid_offset: float = 0.0,
    grid_indexing: str = "ij",
    normalize_coords: str = "separate",
) -> Tensor:
    """``(H, W, 2)`` the coordinates timm's RoPE modules give the cells of a ``shape`` grid: ``index``
    (``i + offset``), ``pixel`` (``-1 .. 1``) or ``centered`` (DINOv3's ``(i + 0.5 + offset) / size``
    mapped to ``-1 .. 1``), rescaled to ``ref_feat_shape`` as EVA does; the channels in ``xy`` order for
    ``grid_indexing='xy'``. Written here, not imported, so that the check against each module's own
    table (`PackedRope.check`) holds across timm versions."""
    sizes = list(shape)
    ref = None if ref_feat_shape is None else list(ref_feat_shape)
    if grid_indexing == "xy":
        sizes = sizes[::-1]
        ref = None if ref is None else ref[::-1]
    if grid_type == "pixel":
        axes = [torch.linspace(-1.0, 1.0, steps=n) for n in sizes]
    elif grid_type == "centered":
        denom = {"max": [float(max(sizes))] * 2, "min": [float(min(sizes))] * 2}.get(normalize_coords)
        denom = denom or [float(n) for n in sizes]
        axes = [(torch.arange(0.5, n) + grid_offset) / d for n, d in zip(sizes, denom, strict=True)]
    else:
        axes = [torch.arange(n).float() + grid_offset for n in sizes]
    if ref is not None:
        axes = [t / n * r for t, n, r in zip(axes, sizes, ref, strict=True)]
    grid = torch.stack(torch.meshgrid(axes, indexing=grid_indexing), -1)
    return 2.0 * grid - 1.0 if grid_type == "centered" else grid


def _layout(x: Tensor, rotate_half: bool) -> Tensor:
    """Per-frequency values ``(..., F)`` in timm's rotation layout: halves, or interleaved pairs."""
    return torch.cat([x, x], -1) if rotate_half else x.repeat_interleave(2, -1)


def _sincos(angles: Tensor, rotate_half: bool) -> Tensor:
    """``(..., F)`` angles -> ``(..., 4F)``: sin then cos, each in the module's rotation layout."""
    return torch.cat([_layout(angles.sin(), rotate_half), _layout(angles.cos(), rotate_half)], -1)


def _cat(rope: nn.Module, model: nn.Module) -> PackedRope:
    """`RotaryEmbeddingCat` (EVA-02, the RoPE ViTs, Perception Encoder): coordinate times band."""

    in_pixels = getattr(rope, "in_pixels", False)
    bands = getattr(rope, "bands", None)
    if bands is None:  # timm before 1.0.2x kept only the cached table: its frequencies, as it built them
        count = rope.dim // 4
        if in_pixels:
            bands = pixel_freq_bands(count, float(rope.max_res), linear_bands=rope.linear_bands)
        else:
            bands = freq_bands(count, temperature=float(rope.temperature), step=1)
    bands = bands.float()

    def coords(grid: tuple[int, int]) -> Tensor:
        return cell_grid(
            grid,
            getattr(rope, "grid_type", None) or ("pixel" if in_pixels else "index"),
            rope.ref_feat_shape,
            getattr(rope, "grid_offset", 0.0),
            getattr(rope, "grid_indexing", "ij"),
            getattr(rope, "normalize_coords", "separate"),
        )

    def embed(centre: Tensor) -> Tensor:
        angles = (centre[..., None] * bands.to(centre.device)).flatten(-2)
        return _sincos(angles, getattr(rope, "rotate_half", False))

    return PackedRope(rope, coords, embed, per_block=False, rotate_half=getattr(rope, "rotate_half", False))


def _dinov3(rope: nn.Module, model: nn.Module) -> PackedRope:
    """`RotaryEmbeddingDinoV3`: centred, normalised coordinates over periods."""

    def coords(grid: tuple[int, int]) -> Tensor:
        return cell_grid(grid, "centered", None, rope.grid_offset, rope.grid_indexing, rope.normalize_coords)

    def embed(centre: Tensor) -> Tensor:
        periods = rope.periods.float().to(centre.device)
        angles = (2 * math.pi * centre[..., None] / periods).flatten(-2)
        return _sincos(angles, rope.rotate_half)

    return PackedRope(rope, coords, embed, per_block=False, rotate_half=rope.rotate_half)


def _mixed(rope: nn.Module, model: nn.Module) -> PackedRope:
    """`RotaryEmbeddingMixed` (RoPE-Mixed): learned frequencies per block and head mixing x and y."""

    def coords(grid: tuple[int, int]) -> Tensor:
        return cell_grid(grid, "index", None, 0.0, getattr(rope, "grid_indexing", "xy"))

    def embed(centre: Tensor) -> Tensor:  # x and y mixed by learned frequencies (2, depth, heads, F)
        freqs = rope.freqs.float()
        angles = centre[:, :1] * freqs[0].unsqueeze(-2) + centre[:, 1:2] * freqs[1].unsqueeze(-2)
        return _sincos(angles, False).to(rope.freqs.dtype)

    rotate_half = bool(getattr(model.blocks[0].attn, "rotate_half", False))
    return PackedRope(rope, coords, embed, per_block=True, rotate_half=rotate_half)


_ADAPTERS: dict[str, Callable[[nn.Module, nn.Module], PackedRope]] = {
    "RotaryEmbeddingCat": _cat,
    "RotaryEmbeddingDinoV3": _dinov3,
    "RotaryEmbeddingMixed": _mixed,
}
