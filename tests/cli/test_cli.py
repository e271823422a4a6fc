"""The CLI: the logging step a checkpoint covers, history kept on rank 0 only, the command other ranks rerun."""

from __future__ import annotations

import csv
from types import SimpleNamespace

from lightning.pytorch.loggers import CSVLogger

from splitlab.cli import SplitLabCLI
from splitlab.cli.checkpoints import logged_step


def checkpoint(batches: int, processed: int, completed: int) -> dict:
    progress = {
        "current": {"ready": processed, "started": processed, "processed": processed, "completed": completed}
    }
    loops = {
        "epoch_loop.state_dict": {"_batches_that_stepped": batches},
        "epoch_loop.batch_progress": progress,
    }
    return {"global_step": 4 * batches, "loops": {"fit_loop": loops}}


def test_the_logged_step_counts_batches_not_optimizer_steps() -> None:
    assert logged_step(checkpoint(3, processed=3, completed=3)) == 2  # end of epoch: rows at steps 0..2
    assert logged_step(checkpoint(5, processed=6, completed=5)) == 5  # inside batch 5's hooks: its rows count
    assert logged_step({"global_step": 7}) == 7  # no loop state: the old rule


def test_only_rank_zero_touches_the_csv_history(tmp_path) -> None:
    """Other ranks' CSV loggers hold a dummy experiment: reading its keys failed on every resumed
    multi-GPU fit. They leave the file to rank 0."""
    (tmp_path / "metrics.csv").write_text("epoch,step,loss\n0,0,1.0\n")
    logger = CSVLogger(tmp_path, name="", version="")
    rank1 = SimpleNamespace(_resume_step=0, trainer=SimpleNamespace(is_global_zero=False, loggers=[logger]))
    SplitLabCLI.before_fit(rank1)
    assert (tmp_path / "metrics.csv").read_text() == "epoch,step,loss\n0,0,1.0\n"
    rank0 = SimpleNamespace(_resume_step=0, trainer=SimpleNamespace(is_global_zero=True, loggers=[logger]))
    SplitLabCLI.before_fit(rank0)
    kept = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert kept == [{"epoch": "0", "step": "0", "loss": "1.0"}]


def test_other_ranks_would_be_started_with_the_lightning_command(monkeypatch) -> None:
    """Lightning's DDP launcher starts ranks 1.. from ``sys.argv``: while a command given from Python
    runs (``splitlab curve``, the demo), that is ``<program> <the command>``, restored after."""
    import sys

    import splitlab.cli as cli

    seen = []
    monkeypatch.setattr(cli, "SplitLabCLI", lambda *args, **kwargs: seen.append(list(sys.argv)))
    before = list(sys.argv)
    cli.lightning_main(["validate", "--config", "run/config.yaml"])
    assert seen == [[before[0], "validate", "--config", "run/config.yaml"]] and sys.argv == before


def test_the_check_that_explains_an_error_is_the_one_reported(capsys) -> None:
    """A check that catches a lower error and says what it means wins over the error it caught (a
    prompt's ``KeyError: 'answer'`` alone told the user "answer")."""
    import pytest

    from splitlab.cli.errors import reporting_errors
    from splitlab.heads.vqa import LanguageBridge

    with pytest.raises(SystemExit):
        reporting_errors(lambda: LanguageBridge(None, None, template="<image> {question} {answer}"))
    err = capsys.readouterr().err
    assert err.startswith(
        "splitlab: error: prompt='<image> {question} {answer}': only {question} may be a field"
    )


def test_a_run_that_stops_with_an_error_tears_its_process_group_down(tmp_path, monkeypatch, capsys) -> None:
    """The one-line error ends in ``sys.exit``: a process group left to interpreter exit was torn
    down in varying order, and on CI a rank printed "terminate called without an active exception"
    after its one line. The group goes down before the exit, as after a run that ends well."""
    import pytest
    import torch.distributed as dist

    import splitlab.cli as cli

    missing = tmp_path / "recipe.yaml"
    monkeypatch.setattr(cli, "lightning_main", lambda args: missing.read_text())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(SystemExit) as stopped:
            cli.main(["fit", "--config", str(missing)])
        assert stopped.value.code == 2 and not dist.is_initialized()
        err = capsys.readouterr().err
        assert err.startswith("splitlab: error: ") and "recipe.yaml" in err
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
