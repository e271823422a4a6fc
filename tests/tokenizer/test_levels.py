import pytest

from splitlab.tokenizer import Levels


def test_valid_levels_and_geometry() -> None:
    levels = Levels.build((64, 32, 16), patch_size=16)
    assert levels.num == 3 and levels.finest == 16 and levels.coarsest == 64
    assert levels.cells(0) == 4 and levels.cells(2) == 1
    assert levels.grid(0, (128, 192)) == (2, 3)
    assert levels.min_fraction == pytest.approx(1 / 16)


def test_default_levels_fit_the_image() -> None:
    assert Levels.default(16, (224, 224)).sizes == (32, 16)  # 224 = 7 * 32, not divisible by 64
    assert Levels.default(14, (336, 336)).sizes == (56, 28, 14)
    assert Levels.default(16, (256, 256)).sizes == (64, 32, 16)


def test_one_level_is_refused_by_name() -> None:
    """A single level leaves nothing to decide (the tokenizer would index an empty logit list)."""
    from splitlab.tokenizer import SplitTokenizer

    with pytest.raises(ValueError, match=r"levels=\(16,\): SPLIT needs at least two patch sizes"):
        SplitTokenizer(32, Levels.build((16,)))
    with pytest.raises(ValueError, match="image size 208x208 is not divisible by 32"):
        Levels.default(16, (208, 208))  # 13 patches a side: no coarse level divides it


@pytest.mark.parametrize("sizes", [(64, 30, 16), (64, 16), (16, 32)])
def test_levels_must_halve(sizes) -> None:
    with pytest.raises(ValueError, match="levels=.*half"):
        Levels.build(sizes)


def test_finest_must_be_patch_size() -> None:
    with pytest.raises(ValueError, match="finest level must equal the backbone's patch size \\(14\\)"):
        Levels.build((64, 32, 16), patch_size=14)


def test_image_not_divisible_by_coarsest() -> None:
    with pytest.raises(
        ValueError, match="image size 224x224 is not divisible by the coarsest level \\(64 px\\)"
    ):
        Levels.build((64, 32, 16)).check_image((224, 224))


@pytest.mark.parametrize("fraction", [0.05, 1.01, 0.0])
def test_unreachable_fraction(fraction) -> None:
    with pytest.raises(ValueError, match="target_fraction=.* outside the range"):
        Levels.build((64, 32, 16)).check_fraction(fraction)
