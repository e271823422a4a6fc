"""Errors about settings and files reach the user as one line, not a traceback."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from splitlab.cli.console import quiet_console
from splitlab.cli.renamed import as_given

PACKAGE = str(Path(__file__).resolve().parents[1])
FILE_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps (jsonargparse and Lightning re-raise ours), outermost first."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return chain


def _file_in_the_way(path: Path) -> Path:
    """The first file on ``path`` (``path`` itself, or a file standing where one of its folders goes)."""
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            return part
    return path


def _raised_by_splitlab(error: BaseException) -> bool:
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and last.tb_frame.f_code.co_filename.startswith(PACKAGE)


def user_error(error: BaseException) -> BaseException | None:
    """The exception to report as one line, or None (a bug: it keeps its traceback).

    splitlab's own checks raise ``ValueError`` / ``TypeError`` / ``RuntimeError`` / ``OSError``
    messages that name the setting (with its value) or the file, and the fix: the outermost of
    those wins (a check that catches a lower error and says what it means, e.g. a prompt's
    ``KeyError``, says more than the error it caught). Without one, the innermost file or argument
    error from anywhere (jsonargparse and Lightning wrap the real one in their own).
    """
    chain = _chain(error)
    for link in chain:
        if isinstance(
            link, ValueError | TypeError | RuntimeError | OSError | KeyError
        ) and _raised_by_splitlab(link):
            return link
    found = None
    for link in chain:
        if isinstance(link, (*FILE_ERRORS, argparse.ArgumentError)):
            found = link
    return found


def config_files(argv: Sequence[str]) -> list[str]:
    """The ``--config`` / ``-c`` files of a command line."""
    files, taking = [], False
    for word in argv:
        if taking:
            files.append(word)
        taking = word in ("--config", "-c")
        if word.startswith("--config="):
            files.append(word.split("=", 1)[1])
    return files


def yaml_problem(argv: Sequence[str]) -> str | None:
    """Which ``--config`` file is not valid YAML, where, and why (jsonargparse names only
    ``<unicode string>``), or None."""
    import yaml

    for name in config_files(argv):
        try:
            yaml.safe_load(Path(name).read_text())
        except OSError:
            continue
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            return f"--config {name}: not valid YAML{where}: {problem}"
    return None


PACKAGE = str(Path(__file__).resolve().parents[1])  # splitlab's own files


def one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """``splitlab: warning: ...`` for splitlab's own warnings, as its errors read (Python's format
    adds the file, line and source of the ``warnings.warn`` call, which tell a user nothing);
    anything else's in Python's format."""
    if str(Path(filename).resolve()).startswith(PACKAGE):
        return f"splitlab: warning: {message}\n"
    return DEFAULT_FORMAT(message, category, filename, lineno, line)


DEFAULT_FORMAT = warnings.formatwarning


def reporting_errors(run: Callable[[], Any], argv: Sequence[str] = ()) -> Any:
    """Run ``run``; a bad setting or file ends the process with one line on stderr and exit code 2,
    and splitlab's own warnings read as one line each (`one_line_warning`); third-party messages
    checked to be harmless are silenced (`splitlab.cli.console`).

    ``argv``: the command line, to name a config file that is not valid YAML. ``SPLITLAB_DEBUG=1``
    shows the full traceback instead.
    """
    warnings.formatwarning = one_line_warning
    quiet_console()
    try:
        return run()
    except Exception as error:
        cause = user_error(error)
        if cause is None or os.environ.get("SPLITLAB_DEBUG"):
            raise
        message = str(cause).strip() or type(cause).__name__
        if "<unicode string>" in message:
            message = yaml_problem(argv) or message
        if isinstance(cause, KeyError) and cause.args:
            message = str(cause.args[0])
        elif isinstance(cause, FileExistsError | NotADirectoryError) and cause.filename:
            message = (
                f"{_file_in_the_way(Path(cause.filename))}: a file stands where the run needs a folder "
                f"({cause.strerror}); move it, "
                "or choose another folder (trainer.logger save_dir, trainer.default_root_dir)"
            )
        if isinstance(cause, argparse.ArgumentError):
            message = as_given(message, argv)
        if isinstance(cause, TypeError | KeyError | RuntimeError):  # as likely a bug as a setting
            message += " (SPLITLAB_DEBUG=1 shows the traceback)"
        print(f"splitlab: error: {message}", file=sys.stderr)
        sys.exit(2)
