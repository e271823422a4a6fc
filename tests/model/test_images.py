"""`splitlab.model.images`: files as users have them (16-bit, float, palette, LA, RGBA, CMYK, 1-bit,
animated, EXIF-turned) decode to the pixels of their 8-bit upright twin and predict the same; what
is dropped is said once; ``exif_transpose`` off reads the pixels as stored, in the API and the CLI."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from splitlab.commands import main
from splitlab.model.images import ImageConversionWarning, ImageDecoder, decode_image
from splitlab.model.predict import UNREADABLE, InputImages, as_image
from splitlab.model.preprocess import Preprocessing
from tests.model.helpers import tiny_model
from tests.model.user_images import HIGH, LOSSLESS, LOW, picture, sixteen_bit, write_user_images


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_user_images(tmp_path_factory.mktemp("user_images"))


@pytest.fixture(scope="module")
def model():
    return tiny_model("classification")


def pixels(image: Image.Image) -> np.ndarray:
    assert image.mode == "RGB"
    return np.asarray(image)


def conversions(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, ImageConversionWarning)]


def test_every_kind_of_file_decodes_to_its_8bit_upright_pixels(files) -> None:
    upright = np.stack([picture()] * 3, -1)
    with Image.open(files["grey16.tif"]) as raw:  # a real 16-bit file, which PIL alone turns white
        assert raw.mode == "I;16" and np.asarray(raw).min() == LOW and np.asarray(raw).max() == HIGH
        assert (np.asarray(raw.convert("RGB")) == 255).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageConversionWarning)
        for name in ("upright.png", *LOSSLESS):
            assert np.array_equal(pixels(decode_image(files[name])), upright), name
        # JPEG is lossy: the turned one read upright is its upright twin, and close to the picture
        turned, twin = pixels(decode_image(files["rotated.jpg"])), pixels(decode_image(files["upright.jpg"]))
        assert np.array_equal(turned, twin) and np.abs(twin.astype(int) - upright).max() <= 3
        bilevel = pixels(decode_image(files["bilevel.png"]))
        assert bilevel.shape == upright.shape and set(np.unique(bilevel)) == {0, 255}
        # a PIL image and a file object decode as the path does; the input is left as it was
        with Image.open(files["grey16.png"]) as given:
            assert np.array_equal(pixels(decode_image(given)), upright) and given.mode == "I;16"
        with open(files["rotated.jpg"], "rb") as handle:
            assert np.array_equal(pixels(decode_image(handle)), twin)


def test_high_depth_images_are_scaled_by_their_own_range() -> None:
    twelve_bit = np.array([[0, 1024], [2048, 4095]], dtype=np.uint16)  # a 12-bit scanner's data
    assert pixels(decode_image(Image.fromarray(twelve_bit)))[..., 0].tolist() == [[0, 64], [128, 255]]
    floats = np.array([[np.nan, -1.0], [0.0, 1.0]], dtype=np.float32)
    assert pixels(decode_image(Image.fromarray(floats)))[..., 0].tolist() == [[0, 0], [128, 255]]
    with pytest.warns(ImageConversionWarning, match="constant 30000, read as black"):
        constant = decode_image(Image.fromarray(np.full((4, 4), 30000, np.uint16)), name="flat.tif")
    assert not pixels(constant).any()
    big_endian = Image.frombytes(
        "I;16B", (2, 2), sixteen_bit(np.array([0, 85, 170, 255])).astype(">u2").tobytes()
    )
    assert pixels(decode_image(big_endian))[..., 0].ravel().tolist() == [0, 85, 170, 255]


def test_an_8bit_file_and_its_16bit_twin_decode_alike_by_the_types_range(tmp_path, model) -> None:
    """``high_depth: dtype`` reads a 16-bit file (values x257), a 12-bit one in a 16-bit TIFF that says
    so (MaxSampleValue 4095) and floats in 0..1 as their 8-bit twin is read; the default, ``range``,
    scales each by its own extremes (the twins then differ)."""
    grey = (40 + picture().astype(np.float64) * 160 / 255).round().astype(np.uint8)  # 40..200: no 0, no 255
    files = {
        "8bit.png": grey,
        "16bit.png": grey.astype(np.uint16) * 257,
        "16bit.tif": grey.astype(np.uint16) * 257,
    }
    for name, values in files.items():
        Image.fromarray(values).save(tmp_path / name)
    twelve = np.round(grey.astype(np.float64) * 4095 / 255).astype(np.uint16)
    Image.fromarray(twelve).save(tmp_path / "12bit.tif", tiffinfo={281: 4095})
    Image.fromarray((grey / 255).astype(np.float32)).save(tmp_path / "float.tif")
    names = [*files, "12bit.tif", "float.tif"]
    prep = dataclasses.replace(model.preprocessing, high_depth="dtype")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageConversionWarning)
        expected = pixels(decode_image(tmp_path / "8bit.png"))
        for name in names:
            decoded = decode_image(tmp_path / name, high_depth="dtype")
            assert np.array_equal(pixels(decoded), expected), name
            with Image.open(tmp_path / name) as opened:  # the network input too, through the preprocessing
                assert torch.equal(prep(opened)[0], prep(Image.open(tmp_path / "8bit.png"))[0]), name
        assert not np.array_equal(pixels(decode_image(tmp_path / "16bit.png")), expected)  # range: stretched
        assert Preprocessing(64).high_depth == "range"  # the default
        rows = model.predict([tmp_path / n for n in names], num_workers=0, high_depth="dtype")
    assert all(r == rows[0] for r in rows)  # every twin: the 8-bit file's prediction
    with pytest.raises(ValueError, match="high_depth='bits': expected 'range'"):
        ImageDecoder(high_depth="bits")
    with pytest.raises(ValueError, match="preprocessing high_depth='bits'"):
        Preprocessing(64, high_depth="bits")


def test_predictions_on_each_file_equal_those_on_the_8bit_upright_twin(files, model) -> None:
    names = ["upright.png", *LOSSLESS, "upright.jpg", "rotated.jpg", "sideways.png"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageConversionWarning)
        results = dict(zip(names, model.predict([files[n] for n in names], num_workers=0), strict=True))
    twin = results["upright.png"]
    for name in (*LOSSLESS, "upright.jpg", "rotated.jpg"):
        assert results[name]["class"] == twin["class"], name
        assert results[name]["probability"] == pytest.approx(twin["probability"], abs=1e-6), name
        assert results[name]["token_fraction"] == twin["token_fraction"], name
    # the test can fail: the picture turned sideways (or white) is predicted otherwise
    white = model.predict(Image.new("RGB", (256, 192), "white"))[0]
    for other in (results["sideways.png"], white):
        assert other["probability"] != pytest.approx(twin["probability"], abs=1e-4)
    # tensors keep working: uint8, and float in [0, 1]
    upright = torch.from_numpy(np.stack([picture()] * 3))
    for tensor in (upright, upright.float() / 255):
        assert model.predict(tensor)[0]["probability"] == pytest.approx(twin["probability"], abs=1e-6)
    assert np.array_equal(pixels(as_image(upright.float() / 255)), np.stack([picture()] * 3, -1))


def test_exif_transpose_off_reads_the_pixels_as_stored(files, model) -> None:
    sideways = pixels(decode_image(files["sideways.png"]))
    stored = pixels(decode_image(files["rotated.jpg"], exif_transpose=False))
    assert stored.shape == (256, 192, 3) and np.array_equal(stored, sideways)
    assert np.array_equal(stored, np.rot90(pixels(decode_image(files["upright.jpg"]))))
    (upright,) = model.predict(files["rotated.jpg"])
    as_stored, side = model.predict([files["rotated.jpg"], files["sideways.png"]], exif_transpose=False)
    assert as_stored == side and upright["probability"] != pytest.approx(side["probability"], abs=1e-4)
    # a model whose data was read as stored predicts as stored by default (config.json keeps it)
    stored_model = tiny_model("classification")
    stored_model.preprocessing = dataclasses.replace(stored_model.preprocessing, exif_transpose=False)
    # (one image against one image: a batch of two adds float noise at 1e-7)
    assert stored_model.predict(files["rotated.jpg"]) == model.predict(files["sideways.png"])
    assert stored_model.predict(files["rotated.jpg"], exif_transpose=True) == [upright]
    config = stored_model.preprocessing.to_dict()
    assert config["exif_transpose"] is False and Preprocessing.from_dict(config) == stored_model.preprocessing
    older = {k: v for k, v in config.items() if k != "exif_transpose"}  # a config.json from before
    assert Preprocessing.from_dict(older).exif_transpose is True
    with pytest.raises(ValueError, match="exif_transpose='no': expected true or false"):
        Preprocessing(64, exif_transpose="no")
    # Preprocessing on a PIL image decodes it as the readers do, upright as it says
    prep = stored_model.preprocessing
    assert torch.equal(prep(Image.open(files["rotated.jpg"]))[0], prep(Image.open(files["sideways.png"]))[0])
    assert InputImages([files["rotated.jpg"]], prep, exif_transpose=True).decode.exif_transpose


def test_what_is_dropped_is_said_once_per_run_naming_one_file(files, model, tmp_path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for name in ("rgba.png", "la.png", "palette.png", "animated.gif", "grey16.png", "grey16.tif"):
        for copy in range(3):
            shutil.copy(files[name], folder / f"{copy}-{name}")
    inputs = sorted(folder.iterdir())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert len(model.predict(inputs, num_workers=0, batch_size=4)) == 18
    said = conversions(record)
    assert len(said) == 3, said  # transparency, frames, 16-bit: once each for 18 files
    assert any("0-animated.gif: 2 frames" in s and "frame 1 is read, the rest dropped" in s for s in said)
    assert any("0-grey16.png: 16-bit greyscale (I;16, values 7967..57825 scaled" in s for s in said)
    assert sum("transparency" in s and "dropped" in s for s in said) == 1
    assert all("said once" in s for s in said)
    # a reader's decoder says each kind once; the bare function, each time
    decode = ImageDecoder()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for path in inputs:
            decode(path)
        decode_image(files["rgba.png"])
        decode_image(files["rgba.png"])
    assert len(conversions(record)) == 3 + 2
    with warnings.catch_warnings(record=True) as record:  # 8-bit RGB, L and turned JPEGs: nothing to say
        warnings.simplefilter("always")
        ImageDecoder()(files["upright.png"]), ImageDecoder()(files["rotated.jpg"])
    assert not conversions(record)


def test_what_cannot_be_decoded_raises_what_the_readers_count(tmp_path) -> None:
    from splitlab.data.common import UNREADABLE as SKIPPED

    text = tmp_path / "notes.png"
    text.write_text("not an image")
    cut = tmp_path / "cut.png"
    Image.fromarray(picture()).save(cut)
    cut.write_bytes(cut.read_bytes()[:300])
    for path in (text, cut):
        with pytest.raises(SKIPPED) as caught:
            decode_image(path)
        assert isinstance(caught.value, UNREADABLE)


def test_splitlab_predict_flag(files, tmp_path, capsys) -> None:
    model = tiny_model("classification")
    model.save_pretrained(tmp_path / "model")
    inputs = [
        str(files[n]) for n in ("rotated.jpg", "upright.jpg", "sideways.png", "grey16.tif", "upright.png")
    ]
    rows = {}
    for flag in ("--exif-transpose", "--no-exif-transpose"):
        out = tmp_path / flag.strip("-")
        with pytest.raises(SystemExit) as stop, warnings.catch_warnings():
            warnings.simplefilter("ignore", ImageConversionWarning)
            main(["predict", str(tmp_path / "model"), *inputs, "--out", str(out), "--num-workers", "0", flag])
        assert stop.value.code == 0, capsys.readouterr().err
        lines = (out / "predictions.jsonl").read_text().splitlines()
        rows[flag] = {r.pop("file").rsplit("/", 1)[-1]: r for r in map(json.loads, lines)}
    on, off = rows["--exif-transpose"], rows["--no-exif-transpose"]
    assert on["rotated.jpg"] == on["upright.jpg"] and off["rotated.jpg"] == off["sideways.png"]
    assert on["rotated.jpg"] != off["rotated.jpg"]
    assert on["grey16.tif"]["class"] == on["upright.png"]["class"]
    assert on["grey16.tif"]["probability"] == pytest.approx(on["upright.png"]["probability"], abs=1e-6)
