"""Harder scenes for the generators' ``difficulty="hard"``: where one object per scene on block noise
no longer tells policies apart (issue 49).

A hard scene has many objects at several scales (some smaller than one coarse patch, thin ones
larger than half the image), thin structures one to three finest-patch cells wide as classes of
their own (lines, grids, rings), objects whose class is their outline (solid or dashed) rather than
their fill, later objects touching and occluding earlier ones, all on a procedural natural texture
(fractal value noise, a gradient and ripples: structure that is not an object). A coarse token blurs
the 2 px patterns and outlines and smears a thin structure over its whole patch, so fine tokens must
go to the objects, the thin structures and the outlines, and to little else.
"""

from __future__ import annotations

import numpy as np

TEXTURED = ("hstripes", "vstripes", "checks")  # class = the 2 px pattern of the fill
OUTLINED = ("framed", "dashed")  # class = the outline (solid or dashed) around a flat fill
THIN = ("line", "grid", "ring")  # class = a thin shape, 1-3 finest cells wide
HARD_THINGS = (*TEXTURED, *OUTLINED, *THIN)


def value_noise(rng: np.random.Generator, img_size: int, cell: int) -> np.ndarray:
    """``(H, W)`` smooth noise in [0, 1]: random values on a ``cell``-px lattice, bilinearly interpolated."""
    n = img_size // cell + 2
    grid = rng.random((n, n), dtype=np.float32)
    pos = np.arange(img_size, dtype=np.float32) / cell
    i = pos.astype(int)
    t = pos - i
    t = t * t * (3 - 2 * t)  # smoothstep: no visible lattice creases
    rows = grid[i] * (1 - t)[:, None] + grid[i + 1] * t[:, None]
    return rows[:, i] * (1 - t)[None] + rows[:, i + 1] * t[None]


def natural_texture(rng: np.random.Generator, img_size: int) -> np.ndarray:
    """``(H, W, 3)`` float background: fractal value noise (octaves of 32 down to 2 px) in two colours,
    a linear gradient and faint ripples. High pixel entropy everywhere, structure at every scale, and
    none of it an object: what a natural background is to a policy that splits on detail."""
    octaves = [(32, 0.5), (16, 0.25), (8, 0.15), (4, 0.07), (2, 0.03)]
    noise = sum(w * value_noise(rng, img_size, c) for c, w in octaves) / sum(w for _, w in octaves)
    low, high = rng.random(3) * 0.5, 0.5 + rng.random(3) * 0.5
    img = low + (high - low) * noise[..., None]
    ys, xs = np.mgrid[0:img_size, 0:img_size].astype(np.float32) / img_size
    angle = rng.uniform(0, 2 * np.pi)
    img += 0.15 * ((np.cos(angle) * xs + np.sin(angle) * ys) - 0.5)[..., None]
    period, phase = rng.uniform(5, 9), rng.uniform(0, 2 * np.pi)
    ripple = np.sin(2 * np.pi * (xs + 0.6 * ys) * img_size / period + 3 * noise + phase)
    img += 0.05 * ripple[..., None]
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A dark and a light colour, in random order: the two inks of a pattern or an outline."""
    dark, light = rng.random(3) * 0.3, 0.7 + rng.random(3) * 0.3
    return (light, dark) if rng.random() < 0.5 else (dark, light)


def thin_mask(kind: str, rng: np.random.Generator, img_size: int, cell: int) -> np.ndarray:
    """``(H, W)`` bool footprint of a thin structure ``cell/2`` to ``2*cell`` px wide (1-3 finest cells
    across): a line at any angle, a small lattice of such lines, or a ring (often wider than half the image)."""
    width = float(rng.uniform(cell / 2, 2 * cell))
    ys, xs = np.mgrid[0:img_size, 0:img_size].astype(np.float32) + 0.5
    if kind == "line":
        length = rng.uniform(0.4, 0.9) * img_size
        cx, cy = rng.uniform(0.2, 0.8, size=2) * img_size
        angle = rng.uniform(0, np.pi)
        along = (xs - cx) * np.cos(angle) + (ys - cy) * np.sin(angle)
        across = -(xs - cx) * np.sin(angle) + (ys - cy) * np.cos(angle)
        return (np.abs(across) <= width / 2) & (np.abs(along) <= length / 2)
    if kind == "grid":
        width = float(rng.uniform(cell / 2, cell))  # a lattice of wide lines would be a block
        side = int(rng.integers(img_size // 4, img_size * 3 // 8 + 1))
        period = int(rng.integers(int(2.5 * cell), 4 * cell + 1))
        x0, y0 = (int(v) for v in rng.integers(0, img_size - side + 1, size=2))
        inside = (xs >= x0) & (xs < x0 + side) & (ys >= y0) & (ys < y0 + side)
        on = ((xs - x0) % period < width) | ((ys - y0) % period < width)
        return inside & on
    if kind == "ring":
        radius = rng.uniform(0.12, 0.4) * img_size
        cx, cy = rng.uniform(radius, img_size - radius, size=2)
        r = np.hypot(xs - cx, ys - cy)
        return np.abs(r - radius) <= width / 2
    raise ValueError(f"unknown thin structure {kind!r}")


def outlined_object(
    kind: str, rng: np.random.Generator, side: int, fill: np.ndarray, ink: np.ndarray
) -> np.ndarray:
    """``(side, side, 3)`` flat square of ``fill`` with a 2 px outline of ``ink``: solid (``framed``) or
    dashed in 2 px steps (``dashed``). The fill says nothing; only fine tokens on the edge tell the class."""
    patch = np.broadcast_to(fill, (side, side, 3)).copy()
    yy, xx = np.mgrid[0:side, 0:side]
    edge = (yy < 2) | (xx < 2) | (yy >= side - 2) | (xx >= side - 2)
    if kind == "dashed":
        edge &= ((yy + xx) // 2) % 2 == 0
    patch[edge] = ink
    return patch


def textured_object(rng: np.random.Generator, pattern: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A square or disc filled with ``pattern`` (a ``(side, side)`` bool mask of fine detail) in two
    colours: ``(side, side, 3)`` colours and the ``(side, side)`` shape."""
    side = pattern.shape[0]
    yy, xx = np.mgrid[0:side, 0:side]
    disc = ((yy - side / 2 + 0.5) ** 2 + (xx - side / 2 + 0.5) ** 2) <= (side / 2) ** 2
    shape = disc if rng.random() < 0.5 else np.ones((side, side), bool)
    a, b = colours(rng)
    return np.where(pattern[..., None], b, a), shape


def place(rng: np.random.Generator, img_size: int, side: int) -> tuple[int, int]:
    """Top-left corner of a ``side``-px object anywhere in the image."""
    x0, y0 = (int(v) for v in rng.integers(0, img_size - side + 1, size=2))
    return x0, y0
