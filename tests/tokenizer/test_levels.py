import pytest

from splitlab.tokenizer import Levels


def test_valid_levels_and_geometry() -> None:
    levels = Levels.build((64, 32, 16), patch_size=16)
    assert levels.num == 3 and levels.finest == 16 and levels.coarsest == 64
    assert levels.cells(0) == 4 and levels.cells(2) == 1
    assert levels.grid(0, (128, 192)) == (2, 3)
    assert levels.min_fraction == pytest.approx(1 / 16)


def test_a_grid_the_coarsest_level_does_not_divide_gets_clipped_edge_patches() -> None:
    """27 x 37 finest cells under patches of 4 x 4 cells: 7 x 10 coarse patches, the last row and
    column of them clipped (3 of 4 rows, 1 of 4 columns), none past the grid."""
    levels = Levels.build((56, 28, 14))
    img = (27 * 14 + 6, 37 * 14)  # 6 px past the last whole patch, as SigLIP-so400m/14 at 384 leaves
    assert levels.finest_grid(img) == (27, 37)
    assert levels.grids((27, 37)) == ((7, 10), (14, 19), (27, 37))
    assert levels.clipped((27, 37)) and not levels.clipped((28, 36))
    assert levels.min_fraction_on((27, 37)) == pytest.approx(70 / (27 * 37))
    assert levels.min_fraction_on((28, 36)) == pytest.approx(levels.min_fraction)


def test_default_levels_fit_the_image() -> None:
    assert Levels.default(16, (224, 224)).sizes == (32, 16)  # 224 = 7 * 32, not divisible by 64
    assert Levels.default(14, (336, 336)).sizes == (56, 28, 14)
    assert Levels.default(16, (256, 256)).sizes == (64, 32, 16)
    # no ladder divides 13 or 37 patches a side: the full ladder, its edge patches clipped
    assert Levels.default(16, (208, 208)).sizes == (64, 32, 16)
    assert Levels.default(14, (518, 518)).sizes == (56, 28, 14)


def test_one_level_is_refused_by_name() -> None:
    """A single level leaves nothing to decide (the tokenizer would index an empty logit list)."""
    from splitlab.tokenizer import SplitTokenizer

    with pytest.raises(ValueError, match=r"levels=\(16,\): SPLIT needs at least two patch sizes"):
        SplitTokenizer(32, Levels.build((16,)))
    with pytest.raises(ValueError, match="image size 8x8 is smaller than one patch of 16 px"):
        Levels.default(16, (8, 8))


@pytest.mark.parametrize("sizes", [(64, 30, 16), (64, 16), (16, 32)])
def test_levels_must_halve(sizes) -> None:
    with pytest.raises(ValueError, match="levels=.*half"):
        Levels.build(sizes)


def test_finest_must_be_patch_size() -> None:
    with pytest.raises(ValueError, match="finest level must equal the backbone's patch size \\(14\\)"):
        Levels.build((64, 32, 16), patch_size=14)


def test_image_smaller_than_a_patch() -> None:
    Levels.build((64, 32, 16)).check_image((224, 224))  # 14 cells a side: clipped edge patches, fine
    with pytest.raises(ValueError, match="image size 224x8 is smaller than one patch of the finest level"):
        Levels.build((64, 32, 16)).check_image((224, 8))


@pytest.mark.parametrize("fraction", [0.05, 1.01, 0.0])
def test_unreachable_fraction(fraction) -> None:
    with pytest.raises(ValueError, match="budget=.* outside the range"):
        Levels.build((64, 32, 16)).check_fraction(fraction)
