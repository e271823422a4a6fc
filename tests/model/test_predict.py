"""`splitlab predict` and `SplitModel.predict` on raw files of every task: JPEG and PNG of mixed sizes
and modes, a file that is not an image, results in each input's own pixels, the task's results file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from splitlab.commands import main
from tests.model.helpers import tiny_model

SIZES = {
    "wide.jpg": (96, 40, "RGB"),
    "tall.png": (30, 70, "RGB"),
    "square.png": (64, 64, "RGBA"),
    "grey.jpg": (50, 50, "L"),
}


@pytest.fixture
def files(tmp_path):
    """Four images (JPEG and PNG, RGB / RGBA / greyscale, none or one at the model's size) and a
    text file named like an image, in a folder with a subfolder."""
    folder = tmp_path / "inputs"
    (folder / "more").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, (name, (w, h, mode)) in enumerate(SIZES.items()):
        where = folder / "more" if i % 2 else folder
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode).save(where / name)
    (folder / "notes.png").write_text("not an image")
    return folder


def run(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["predict", *argv])
    captured = capsys.readouterr()
    assert stop.value.code == 0, captured.err
    return captured.out


def lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def saved(task: str, tmp_path, **settings):
    model = tiny_model(task, tmp_path, **settings)
    model.save_pretrained(tmp_path / task)
    return model, str(tmp_path / task)


def test_classification_names_each_file_and_skips_what_is_not_an_image(files, tmp_path, capsys) -> None:
    model, path = saved("classification", tmp_path)
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="notes.png: not a readable image"):
        said = run(capsys, path, str(files), "--out", str(out), "--token-maps", "--num-workers", "0")
    rows = lines(out)
    assert sorted(r["file"].rsplit("/", 1)[-1] for r in rows) == sorted(SIZES)  # no row for notes.png
    assert "1 skipped" in said and "predicted 4 image(s)" in said
    for row in rows:
        assert row["class"] in model.names and len(row["top_k"]) == 4 and 0 < row["token_fraction"] <= 1
        assert row["tokens"] == round(row["token_fraction"] * 64)
    assert len(list((out / "token_maps").glob("*.png"))) == 4
    # the Python API: one result per input, paths, PIL images and tensors alike
    image = Image.open(files / "wide.jpg")
    by_path, by_pil, by_tensor = model.predict(
        [files / "wide.jpg", image, torch.from_numpy(np.asarray(image.convert("RGB"))).permute(2, 0, 1)]
    )
    assert by_path == by_pil == by_tensor
    row = next(r for r in rows if r["file"].endswith("wide.jpg"))
    assert {k: row[k] for k in by_path} == by_path
    # an output folder that holds a prediction is refused before any work
    with pytest.raises(SystemExit) as stop:
        main(["predict", path, str(files), "--out", str(out)])
    assert stop.value.code == 2 and "already holds predictions.jsonl" in capsys.readouterr().err


def test_detection_boxes_in_each_images_pixels_and_coco_results(files, tmp_path, capsys) -> None:
    model, path = saved("detection", tmp_path)
    with torch.no_grad():  # a confident head, so that there are detections to check
        model.head.detector.roi_heads.box_predictor.cls_score.bias.copy_(torch.tensor([-5.0, 5, 0, 0]))
    model.save_pretrained(tmp_path / "sure")
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="notes.png"):
        run(capsys, str(tmp_path / "sure"), str(files), "--out", str(out), "--num-workers", "0")
    rows, results = lines(out), json.loads((out / "coco_results.json").read_text())
    ids = json.loads((out / "image_ids.json").read_text())
    assert len(rows) == 4 and sorted(ids.values()) == [1, 2, 3, 4] and results
    for row in rows:
        w, h, _ = SIZES[row["file"].rsplit("/", 1)[-1]]
        boxes = np.array(row["boxes"]).reshape(-1, 4)
        assert len(boxes) and (boxes[:, [0, 2]] <= w).all() and (boxes[:, [1, 3]] <= h).all()
        assert set(row["category_ids"]) <= {1, 5, 9} and set(row["names"]) <= set(model.names)
    mine = [r for r in results if r["image_id"] == rows[0]["image_id"]]
    assert [r["bbox"][2] + r["bbox"][0] for r in mine] == pytest.approx([b[2] for b in rows[0]["boxes"]])
    # image ids from a COCO annotations file, by file name
    annotations = tmp_path / "instances.json"
    annotations.write_text(
        json.dumps({"images": [{"id": 40 + i, "file_name": n} for i, n in enumerate(SIZES)]})
    )
    run(
        capsys,
        str(tmp_path / "sure"),
        *[str(p) for p in files.rglob("*.*g") if p.name != "notes.png"],
        "--out",
        str(tmp_path / "ids"),
        "--annotations",
        str(annotations),
        "--num-workers",
        "0",
    )
    assert {r["image_id"] for r in lines(tmp_path / "ids")} == {40, 41, 42, 43}


def test_segmentation_masks_at_each_inputs_size(files, tmp_path, capsys) -> None:
    model, path = saved("segmentation", tmp_path)
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="notes.png"):
        run(capsys, path, str(files), "--out", str(out), "--num-workers", "0")
    for row in lines(out):
        w, h, _ = SIZES[row["file"].rsplit("/", 1)[-1]]
        mask = np.asarray(Image.open(out / row["mask"]))
        assert mask.shape == (h, w) and set(np.unique(mask).tolist()) == set(row["classes_present"])
    # an input at the network's size: the mask is the head's argmax, upsampled, unchanged
    square = Image.open(next(files.rglob("square.png")))
    (result,) = model.predict(square)
    x, _ = model.preprocessing(square)
    with torch.no_grad():
        logits = model(x[None])[0]["logits"]
    expected = torch.nn.functional.interpolate(logits, size=(64, 64), mode="bilinear").argmax(1)[0]
    assert torch.equal(result["mask"], expected)


def test_vqa_answers_the_questions_of_a_vqav2_file(files, tmp_path, capsys) -> None:
    model, path = saved("vqa", tmp_path)
    folder = tmp_path / "coco"
    folder.mkdir()
    for i, name in enumerate(("COCO_val2014_000000000042.jpg", "COCO_val2014_000000000007.png")):
        Image.open(next(files.rglob(list(SIZES)[i]))).convert("RGB").save(folder / name)
    questions = {
        "questions": [
            {"image_id": 42, "question": "what color is it ?", "question_id": 420},
            {"image_id": 42, "question": "what is it ?", "question_id": 421},
            {"image_id": 7, "question": "what is it ?", "question_id": 70},
        ]
    }
    (tmp_path / "q.json").write_text(json.dumps(questions))
    out = tmp_path / "out"
    run(
        capsys,
        path,
        str(folder),
        "--out",
        str(out),
        "--questions",
        str(tmp_path / "q.json"),
        "--num-workers",
        "0",
    )
    results = json.loads((out / "vqa_results.json").read_text())
    assert [r["question_id"] for r in results] == [70, 420, 421] and all(
        isinstance(r["answer"], str) for r in results
    )
    assert {len(r["answers"]) for r in lines(out)} == {1, 2}
    with pytest.raises(SystemExit) as stop:  # a VQA model with nothing asked: refused before any work
        main(["predict", path, str(folder), "--out", str(tmp_path / "none")])
    assert stop.value.code == 2 and "needs --question or --questions" in capsys.readouterr().err


def test_bad_options_are_one_line_before_any_work(files, tmp_path, capsys) -> None:
    _, path = saved("classification", tmp_path)
    (tmp_path / "file").write_text("")
    for argv, message in (
        ([path, str(files), "--out", str(tmp_path / "file" / "sub")], "not writable"),
        ([path, str(tmp_path / "missing.jpg"), "--out", str(tmp_path / "a")], "no such file or folder"),
        ([path, str(files), "--policy", "best", "--out", str(tmp_path / "b")], "policy='best'"),
        ([path, str(files), "--budget", "0.9", "--out", str(tmp_path / "c")], "budget=0.9"),
        ([path, str(files), "--question", "why ?", "--out", str(tmp_path / "d")], "asks no questions"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(["predict", *argv])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and "Traceback" not in err, err


def test_predict_with_a_recipe_is_lightnings_predict() -> None:
    from splitlab.commands import lightning_predict

    assert lightning_predict(["predict", "--config", "tasks/imagenet.yaml", "--ckpt_path=x"])
    assert lightning_predict(["predict", "-c", "recipe.yaml"])
    assert not lightning_predict(["predict", "runs/demo", "photos/", "--budget", "0.3", "--out", "x"])
