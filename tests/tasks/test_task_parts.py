"""`SplitTask` has one base, `TaskHooks` (Lightning's part), which uses its own members, what `SplitTask`
itself defines (tasks/base.py) and Lightning's API; no private name crosses a file; no attribute of a
task is made or read by name at run time. Read from the source, so a new cross-call fails here."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from lightning import LightningModule
from torch import nn

import splitlab.tasks.base as base
from splitlab.tasks import ClassificationTask, DetectionTask, SegmentationTask, SplitTask, VQATask
from splitlab.tasks.hooks import TaskHooks
from splitlab.tasks.logic import TaskLogic

PARTS = (TaskHooks,)


def members(cls: type) -> set[str]:
    """Names a class defines: its methods, class attributes and the ``self.x`` it assigns."""
    tree = ast.parse(inspect.getsource(cls))
    names = set(vars(cls))
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        targets = [
            t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
        ]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def used(cls: type) -> set[str]:
    """Every ``self.x`` a class reads or calls."""
    tree = ast.parse(inspect.getsource(cls))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }


def lightning_api() -> set[str]:
    return set(dir(LightningModule)) | set(vars(LightningModule()))


def test_a_task_has_one_base_and_it_is_a_lightning_module() -> None:
    """No mixins sharing one ``self``: the template's one base is Lightning's part, on LightningModule."""
    assert SplitTask.__bases__ == (TaskHooks,) and TaskHooks.__bases__ == (LightningModule,)
    for file in Path(base.__file__).parent.glob("*.py"):
        text = file.read_text()
        assert "setattr(self" not in text and "getattr(self" not in text, file.name


@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_a_part_uses_only_itself_its_bases_the_task_and_lightning(part: type) -> None:
    own = set().union(*(members(c) for c in part.__mro__ if c in PARTS))
    host = members(SplitTask)
    foreign = used(part) - own - host - lightning_api()
    owners = {name: [p.__name__ for p in PARTS if name in members(p)] for name in foreign}
    assert not foreign, f"{part.__name__} uses other parts' members: {owners}"


@pytest.mark.parametrize("cls", [*PARTS, SplitTask], ids=lambda c: c.__name__)
def test_no_private_name_crosses_a_file(cls: type) -> None:
    file = Path(inspect.getsourcefile(cls))
    defined = set()
    for other in (*PARTS, SplitTask):
        if Path(inspect.getsourcefile(other)) == file:
            defined |= members(other)
    private = {n for n in used(cls) if n.startswith("_") and not n.startswith("__")}
    crossing = private - defined - lightning_api()
    assert not crossing, f"{file.name} reads private names defined elsewhere: {sorted(crossing)}"


def test_the_template_lists_what_a_task_overrides() -> None:
    """The overridable task API named in `SplitTask`'s docstring exists on it."""
    doc = inspect.getdoc(SplitTask)
    for name in ("build_metrics", "per_image_loss", "update_metrics", "unpack_batch", "describe_prediction"):
        assert f"`{name}`" in doc and callable(getattr(SplitTask, name))
    # 38 settings, one help line each: the template stays readable in one sitting
    assert Path(base.__file__).read_text().count("\n") <= 310


def test_every_setting_of_a_task_has_its_help_line() -> None:
    """`lightning fit --model.help <Task>` reads the settings' lines from `SplitTask.__init__`'s docstring."""
    import docstring_parser

    documented = {p.arg_name for p in docstring_parser.parse(inspect.getdoc(SplitTask.__init__)).params}
    settings = set(inspect.signature(SplitTask.__init__).parameters) - {"self"}
    assert settings <= documented, f"settings without a help line: {sorted(settings - documented)}"


def test_each_tasks_own_code_is_a_plain_object_without_attribute_fallback() -> None:
    """A task's code (`TaskLogic`) is no module of the run and borrows nothing: every name it reads
    is its own or given to it; no class in tasks/ forwards unknown attributes elsewhere."""
    for task in (ClassificationTask, DetectionTask, SegmentationTask, VQATask):
        logic = task.logic_class
        assert issubclass(logic, TaskLogic) and not issubclass(logic, nn.Module), logic
        assert (logic.task_name, logic.metric_name) == (task.task_name, task.metric_name)
        borrowed = used(logic) - set().union(*(members(c) for c in logic.__mro__ if c is not object))
        assert not borrowed, f"{logic.__name__} reads names it does not define: {sorted(borrowed)}"
    for file in Path(base.__file__).parent.glob("*.py"):
        assert "__getattr__" not in file.read_text(), file.name
