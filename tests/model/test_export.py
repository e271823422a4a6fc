"""Export: the deployed path with static shapes equals the eager one, as a `torch.export` program that
torch alone loads and runs, and what ONNX takes of it."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from splitlab.commands import main
from splitlab.model import SplitModel
from splitlab.model.export import StaticSplit, export_program, save_program
from tests.model.helpers import images, tiny_model


@pytest.mark.parametrize("max_fraction", [None, 0.5])
@pytest.mark.parametrize("task", ["classification", "segmentation"])
def test_the_static_path_equals_the_eager_one(task, max_fraction) -> None:
    model = tiny_model(task)
    x = images(6)
    with torch.no_grad():
        eager, layout = model(x, max_fraction=max_fraction)
        static, counts = StaticSplit(model, max_fraction=max_fraction).eval()(x)
    expected = eager if task == "classification" else eager["logits"]
    assert counts.tolist() == layout.seqlens
    assert (static - expected).abs().max() < 1e-5
    if max_fraction is not None:
        assert max(layout.seqlens) <= int(max_fraction * 64)


@pytest.mark.parametrize("max_fraction", [None, 0.75])
@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("test_vit3", {"img_size": 108, "patch_size": 4}),  # SigLIP's shape: map pool, 27 x 27 patches
        ("deit_tiny_distilled_patch16_224", {"img_size": (48, 64), "patch_size": 4, "depth": 2}),  # 12 x 16
    ],
    ids=["map-pool-27x27", "distilled-non-square"],
)
def test_the_static_path_of_clipped_grids_and_other_heads_equals_the_eager_one(
    name, kwargs, max_fraction
) -> None:
    """Clipped edge patches, an attention pool and DeiT's two heads through the static-shape walk."""
    import timm

    torch.manual_seed(0)
    vit = timm.create_model(name, num_classes=3, **kwargs).eval()
    model = SplitModel.from_timm(vit, levels=[16, 8, 4], budget=0.7, decision_dim=16, decision_heads=2).eval()
    torch.nn.init.normal_(model.tokenizer.decision.mlp.fc2.weight, std=1.0)
    x = torch.randn(3, 3, *model.backbone.img_size)
    with torch.no_grad():
        eager, layout = model(x, max_fraction=max_fraction)
        static, counts = StaticSplit(model, max_fraction=max_fraction).eval()(x)
    assert (
        counts.tolist() == layout.seqlens and min(layout.seqlens) < layout.grid_size[0] * layout.grid_size[1]
    )
    assert (static - eager).abs().max() < 1e-5


def test_a_saved_program_runs_with_torch_alone(tmp_path) -> None:
    model = tiny_model("classification", max_fraction=0.5)
    x = images(5)
    program = export_program(model, x[:2])
    path = save_program(program, tmp_path / "model.pt2", model.export_config())
    loaded = torch.export.load(str(path))
    with torch.no_grad():
        expected, layout = model(x)
        got, counts = loaded.module()(x)  # another batch size than the example's
    assert (got - expected).abs().max() < 1e-5 and counts.tolist() == layout.seqlens


def test_export_command_writes_each_format(tmp_path, capsys) -> None:
    model = tiny_model("classification")
    model.save_pretrained(tmp_path / "model")
    for fmt, written in (("hf", "model.safetensors"), ("pt2", "model.pt2")):
        with pytest.raises(SystemExit) as stop:
            main(["export", str(tmp_path / "model"), "--out", str(tmp_path / fmt), "--format", fmt])
        assert stop.value.code == 0 and (tmp_path / fmt / written).is_file()
    with pytest.raises(SystemExit) as stop:  # the deployed budget and cap can be set on the way out
        main(
            [
                "export",
                str(tmp_path / "model"),
                "--out",
                str(tmp_path / "cap"),
                "--budget",
                "0.3",
                "--max-fraction",
                "0.4",
            ]
        )
    assert stop.value.code == 0
    capped = SplitModel.from_pretrained(tmp_path / "cap")
    assert capped.budget == 0.3 and capped.max_tokens == int(0.4 * 64)
    with pytest.raises(SystemExit) as stop:  # nothing overwritten
        main(["export", str(tmp_path / "model"), "--out", str(tmp_path / "pt2"), "--format", "pt2"])
    assert stop.value.code == 2 and "already holds model.pt2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "export",
                str(tmp_path / "model"),
                "--out",
                str(tmp_path / "det"),
                "--format",
                "pt2",
                "--max-fraction",
                "0.01",
            ]
        )
    assert stop.value.code == 2 and "max_fraction" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["hf", "pt2", "onnx"])
def test_export_refuses_a_cap_below_the_budget_in_every_format(fmt, tmp_path, capsys) -> None:
    """The line `lightning validate` and `model(...)` give, before the output folder is made."""
    tiny_model("classification").save_pretrained(tmp_path / "model")
    out = tmp_path / fmt
    with pytest.raises(SystemExit) as stop:
        main(["export", str(tmp_path / "model"), "--out", str(out), "--format", fmt, "--max-fraction", "0.2"])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == (
        "splitlab: error: max_fraction=0.2 is below budget=0.5: a cap under the budget holds every image below "
        "it, so the budget cannot be met; raise max_fraction to at least budget (or lower budget)"
    )
    assert not out.exists()


@pytest.mark.skipif(
    importlib.util.find_spec("onnxscript") is None or importlib.util.find_spec("onnxruntime") is None,
    reason="ONNX export needs onnx, onnxscript and onnxruntime (pip install 'splitlab[export]')",
)
def test_onnx_takes_the_uncapped_path_and_names_what_the_cap_needs(tmp_path, capsys) -> None:
    import onnxruntime

    model = tiny_model("classification")
    model.save_pretrained(tmp_path / "model")
    with pytest.raises(SystemExit) as stop:
        main(["export", str(tmp_path / "model"), "--out", str(tmp_path / "onnx"), "--format", "onnx"])
    assert stop.value.code == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    x = images(2)
    got, counts = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        expected, layout = model(x)
    assert abs(got - expected.numpy()).max() < 1e-4 and counts.tolist() == layout.seqlens
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "export",
                str(tmp_path / "model"),
                "--out",
                str(tmp_path / "capped"),
                "--format",
                "onnx",
                "--max-fraction",
                "0.5",
            ]
        )
    assert stop.value.code == 2 and "aten.sort.stable" in capsys.readouterr().err
