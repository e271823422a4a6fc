"""Dense features from mixed-resolution tokens: a ViTDet-style simple feature pyramid.

Each chosen block's packed tokens are spread back over the finest grid
(`TokenLayout.unpack_to_grid`: a coarse token covers all its cells), then rescaled to strides
4, 8, 16 and 32 px (`pyramid_scales`). Attention stays *global* over each
image's packed sequence: ViTDet's windowed attention needs a regular grid of equal-size tokens,
which a mixed-resolution layout is not. The cost is attention quadratic in the (already shorter)
sequence, e.g. ~2900 tokens per 1024 px image at fraction 0.7 with a /16 backbone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from timm.layers import LayerNorm2d
from torch import Tensor, nn

from splitlab.backbone import PackedFeatures, PackedViT

SCALES = (4.0, 2.0, 1.0, 0.5)
STRIDES = (4, 8, 16, 32)
PYRAMID_CHANNELS = 256  # the pyramid's width by default (ViTDet's)


def pyramid_scales(patch_size: int) -> tuple[float, ...]:
    """Rescaling of the patch grid that gives strides 4, 8, 16, 32 px (for a power-of-two patch).

    A /16 backbone gets ViTDet's (4, 2, 1, 0.5), a /8 one (2, 1, 0.5, 0.25); a /14 backbone cannot
    reach those strides exactly and gets (4, 2, 1, 0.5), i.e. strides 3.5, 7, 14, 28.
    """
    if patch_size & (patch_size - 1) == 0 and 2 <= patch_size <= 64:
        return tuple(patch_size / s for s in STRIDES)
    return SCALES


def _scale_branch(dim: int, scale: float) -> tuple[nn.Module, int]:
    if scale == 8.0:
        raise ValueError("pyramid scale 8: use a coarser stride for patches of 2 px")
    if scale == 4.0:
        half = dim // 2
        return (
            nn.Sequential(
                nn.ConvTranspose2d(dim, half, 2, 2),
                LayerNorm2d(half),
                nn.GELU(),
                nn.ConvTranspose2d(half, dim // 4, 2, 2),
            ),
            dim // 4,
        )
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, 2, 2), dim // 2
    if scale == 1.0:
        return nn.Identity(), dim
    if scale in (0.5, 0.25):
        return nn.MaxPool2d(int(1 / scale)), dim
    raise ValueError(f"pyramid scale {scale}: expected one of 4, 2, 1, 0.5, 0.25")


class SimpleFeaturePyramid(nn.Module):
    """Four feature maps (strides 4, 8, 16, 32 px for a /16 backbone) from ViT tokens, as in ViTDet.

    Args:
        embed_dim: the backbone's width.
        out_channels: channels of every pyramid level.
        num_inputs: 1 (every level from the last requested block, ViTDet) or 4 (one block per
            level, as BEiT/UperNet use intermediate blocks).
        scales: rescaling of each level relative to the patch grid (see `pyramid_scales`).
        indices: the backbone blocks that feed it (what `forward_packed` asks `PackedViT` for).
    """

    @classmethod
    def for_backbone(
        cls, backbone: PackedViT, out_channels: int = PYRAMID_CHANNELS, indices: Sequence[int] | None = None
    ) -> SimpleFeaturePyramid:
        """The pyramid a `PackedViT` feeds: strides from its patch size, blocks checked against its depth.

        Args:
            backbone: the packed backbone.
            out_channels: channels of every pyramid level.
            indices: blocks feeding the levels (1 or 4; default: 4 evenly spaced, ending with the last).
        """
        depth = backbone.depth
        chosen = list(indices) if indices is not None else default_pyramid_indices(depth)
        bad = [i for i in chosen if not -depth <= i < depth]
        if bad:
            raise ValueError(
                f"pyramid_indices={chosen}: block(s) {bad} out of range for a {depth}-block backbone"
            )
        scales = pyramid_scales(backbone.patch_size)
        check_pyramid_grid(backbone.img_size, backbone.patch_size, scales)
        if len(chosen) not in (1, len(scales)):
            raise ValueError(f"pyramid_indices={chosen}: give 1 or {len(scales)} blocks")
        resolved = [i % depth for i in chosen]
        if len(set(resolved)) != len(chosen):
            raise ValueError(f"pyramid_indices={chosen}: each pyramid level needs its own block")
        if resolved != sorted(resolved):  # the backbone hands block outputs over in block order
            raise ValueError(
                f"pyramid_indices={chosen}: list the blocks shallow to deep (blocks {resolved}), finest "
                f"level first, e.g. {sorted(resolved)}"
            )
        return cls(backbone.embed_dim, out_channels, len(chosen), scales, resolved)

    def forward_packed(self, features: PackedFeatures) -> OrderedDict[str, Tensor]:
        """The pyramid of `PackedViT` features computed with ``indices=self.indices``."""
        return self(pyramid_grids(features))

    def __init__(
        self,
        embed_dim: int,
        out_channels: int = PYRAMID_CHANNELS,
        num_inputs: int = 4,
        scales: Sequence[float] = SCALES,
        indices: Sequence[int] = (),
    ) -> None:
        super().__init__()
        if num_inputs not in (1, len(scales)):
            raise ValueError(f"pyramid inputs: 1 or {len(scales)} blocks, got {num_inputs}")
        self.num_inputs = num_inputs
        self.indices = list(indices)
        self.out_channels = out_channels
        self.scales = tuple(scales)
        self.branches = nn.ModuleList()
        self.outputs = nn.ModuleList()
        for scale in self.scales:
            branch, channels = _scale_branch(embed_dim, scale)
            self.branches.append(branch)
            self.outputs.append(
                nn.Sequential(
                    nn.Conv2d(channels, out_channels, 1, bias=False),
                    LayerNorm2d(out_channels),
                    nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                    LayerNorm2d(out_channels),
                )
            )

    def forward(self, grids: Sequence[Tensor]) -> OrderedDict[str, Tensor]:
        """``(B, D, Hf, Wf)`` grids (1 or 4) -> ``{"0": stride p/4, ..., "3": stride 2p}``."""
        if len(grids) != self.num_inputs:
            raise ValueError(f"expected {self.num_inputs} feature grids, got {len(grids)}")
        out = OrderedDict()
        for i, (branch, head) in enumerate(zip(self.branches, self.outputs, strict=True)):
            x = grids[i if self.num_inputs > 1 else 0]
            out[str(i)] = head(branch(x))
        return out


def check_pyramid_grid(img_size: tuple[int, int], patch_size: int, scales: Sequence[float]) -> None:
    """Refuse image sizes whose patch grid the pyramid's pooling levels cannot divide evenly."""
    grid = (img_size[0] // patch_size, img_size[1] // patch_size)
    divisor = max(int(round(1 / s)) for s in scales if s < 1) if any(s < 1 for s in scales) else 1
    if grid[0] % divisor or grid[1] % divisor:
        raise ValueError(
            f"image size {img_size[0]}x{img_size[1]} gives a {grid[0]}x{grid[1]} patch grid, which the feature "
            f"pyramid (scales {tuple(scales)}) cannot pool evenly: use a multiple of {patch_size * divisor} px"
        )


def default_pyramid_indices(depth: int, count: int = 4) -> list[int]:
    """Evenly spaced blocks ending with the last, e.g. (2, 5, 8, 11) of 12."""
    if count == 1:
        return [depth - 1]
    step = depth / count
    return [int(round(step * (i + 1))) - 1 for i in range(count)]


def pyramid_grids(features: PackedFeatures) -> list[Tensor]:
    """The requested blocks' tokens on the finest grid, ``(B, D, Hf, Wf)`` each."""
    layout = features.layout
    return [layout.unpack_to_grid(tokens) for tokens in features.intermediates]
