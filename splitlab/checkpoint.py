"""Reading checkpoints without running them: the one reader of every ``.ckpt`` splitlab opens
(``--ckpt_path`` of fit / validate / test / predict, ``init_checkpoint``, ``policy_checkpoint``,
`splitlab.load` and so predict, bench, export, calibrate and curve, `splitlab.tasks.load_task`).

A ``.ckpt`` is a pickle, and unpickling a pickle calls whatever function it names (``os.system``
...). `read_checkpoint` reads with ``torch.load(weights_only=True)``: tensors, containers, numbers
and strings, and the few other types splitlab and Lightning write into checkpoints (`SAFE_GLOBALS`).
A file that holds anything else is refused in one line naming it and what it holds; a file that
does not read says what it is instead (truncated, a zip without ``data.pkl``, a safetensors file,
JSON, an image, text, ...). `convert_checkpoint` (``splitlab convert-checkpoint IN OUT``) is the one
place that unpickles a file in full, run only when a user who trusts the file asks for it, and it
writes a file that this reader accepts. Torch alone here: any room may call it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import pathlib
import pickle
import re
import shlex
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from splitlab.rl.ppo import PPOConfig

__all__ = [
    "SAFE_GLOBALS",
    "UnreadableCheckpoint",
    "UnsafeCheckpoint",
    "convert_checkpoint",
    "plain",
    "read_checkpoint",
    "safe_checkpoint_globals",
    "what_file",
]

# What splitlab and Lightning write into a checkpoint besides tensors and plain types: a task built
# in Python keeps its ``ppo`` settings as `PPOConfig` in ``hyper_parameters``, a data module given a
# ``pathlib.Path`` root keeps the path. Each rebuilds from its fields; none runs code when read.
SAFE_GLOBALS: list[Any] = [
    PPOConfig,
    pathlib.PosixPath,
    pathlib.PurePosixPath,
    pathlib.WindowsPath,
    pathlib.PureWindowsPath,
]
CONVERT = "splitlab convert-checkpoint"
# how torch's weights-only unpickler names what it refused, by its message
REFUSED = re.compile(
    r"Unsupported global: GLOBAL (\S+) was not"
    r"|unsupported GLOBAL (\S+) whose"
    r"|unrecognized function (.+?)(?: which belongs|$)"
    r"|allowlisted via `add_safe_globals`,? but got <class '([^']+)'>",
    re.MULTILINE,
)
LEGACY = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."  # torch.save's format before the zip (pickled magic)
MAGIC = (  # the first bytes of files people give for a checkpoint by mistake
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"BM", "a BMP image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras or h5py weights)"),
    (b"\x93NUMPY", "a NumPy array file (.npy)"),
    (b"\x1f\x8b", "a gzip archive (a checkpoint inside it must be unpacked first)"),
    (b"BZh", "a bzip2 archive (a checkpoint inside it must be unpacked first)"),
    (b"\xfd7zXZ\x00", "an xz archive (a checkpoint inside it must be unpacked first)"),
    (b"7z\xbc\xaf'\x1c", "a 7-Zip archive (a checkpoint inside it must be unpacked first)"),
)


class UnreadableCheckpoint(ValueError):
    """A checkpoint file that torch cannot read, with what the file is instead."""


class UnsafeCheckpoint(UnreadableCheckpoint):
    """A checkpoint that holds objects other than weights and plain settings (unpickling them would
    run code); ``objects`` names them."""

    def __init__(self, message: str, objects: list[str]) -> None:
        super().__init__(message)
        self.objects = objects


def safe_checkpoint_globals() -> Any:
    """A context in which ``torch.load(weights_only=True)`` also accepts `SAFE_GLOBALS` (for readers
    that are not splitlab's own, e.g. Lightning's ``load_from_checkpoint`` after `read_checkpoint`
    has checked the file)."""
    return torch.serialization.safe_globals(SAFE_GLOBALS)


def read_checkpoint(path: str | Path, setting: str, mmap: bool = False, map_location: Any = "cpu") -> Any:
    """A checkpoint a setting names, read without running anything it holds (``weights_only=True``,
    `SAFE_GLOBALS`), its tensors on ``map_location`` (torch.load's); ``mmap`` maps the tensors instead
    of reading them (a checkpoint in torch's zip format; an older one is read whole).

    Raises:
        FileNotFoundError: no such file (or a folder).
        UnsafeCheckpoint: the file holds other objects (named, with how to convert a trusted file).
        UnreadableCheckpoint: the file is truncated, damaged or not a checkpoint (what it is said).
    """
    file = Path(path)
    where = f"{setting}={str(path)!r}"
    if file.is_dir():
        raise FileNotFoundError(f"{where}: a folder, not a checkpoint file (give the .ckpt file itself)")
    if not file.is_file():
        raise FileNotFoundError(f"{where}: no such checkpoint file")
    try:
        with safe_checkpoint_globals(), warnings.catch_warnings():
            # a plain pickle of a newer protocol: refused below, torch's note on it says nothing more
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(
                file, map_location=map_location, weights_only=True, mmap=mmap and zipfile.is_zipfile(file)
            )
    except Exception as err:
        objects = refused_objects(file, err)
        if objects:
            converted = file.with_name(f"{file.stem}-weights{file.suffix or '.ckpt'}")
            convert = f"{CONVERT} {shlex.quote(str(path))} {shlex.quote(str(converted))}"
            raise UnsafeCheckpoint(
                f"{where} holds objects other than weights and settings ({', '.join(objects)}), which "
                "splitlab never unpickles (unpickling runs what the file names); if you trust where it came "
                f"from, convert it once: {convert} (writes its weights and plain settings only), then give "
                "the new file",
                objects,
            ) from None
        raise UnreadableCheckpoint(f"{where} is not a readable checkpoint: {what_file(file, err)}") from None


def refused_objects(file: Path, err: BaseException) -> list[str]:
    """What a weights-only read refused (the global torch stopped at first, then every other one
    the file names, read from its pickle without running it); empty when ``err`` is no such refusal."""
    if not isinstance(err, pickle.UnpicklingError):
        return []
    found = REFUSED.search(str(err))
    if found is None:
        return []
    first = next(group for group in found.groups() if group).strip()
    try:
        with safe_checkpoint_globals():
            others = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(file)))
    except Exception:  # the whole list is a courtesy: the first one is what torch said
        others = []
    return [first, *(name for name in others if name != first)]


def torch_said(err: BaseException) -> str:
    """The line of torch's error that says what went wrong (its first, or the unpickler's own)."""
    text = str(err).strip()
    for line in text.splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip()[:200]
    first = text.splitlines()[0] if text else type(err).__name__
    first = first.split(". ", 1)[0].rstrip(".")[:200]  # torch's advice after it fits no file here
    return first if type(err).__name__ in first else f"{type(err).__name__}: {first}"


def what_file(file: Path, err: BaseException | None = None) -> str:
    """What a file that torch could not read as a checkpoint is, from its size and first bytes (and
    torch's own error, ``err``): empty, truncated, damaged, another format, text."""
    size = file.stat().st_size
    said = f" (torch: {torch_said(err)})" if err is not None else ""
    if size == 0:
        return "the file is empty (0 bytes): a save or a download that never wrote it"
    with file.open("rb") as f:
        head = f.read(4096)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return what_zip(file, size, said)
    if head.startswith(LEGACY):
        return (
            f"truncated or damaged: {size:,} bytes of a checkpoint in torch's older (non-zip) format that "
            f"do not read to the end{said}"
        )
    if len(head) >= 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") <= size - 8:
        return (
            "a safetensors file (weights without a checkpoint's settings), not a training checkpoint: "
            "give the folder that holds it with its config.json (save_pretrained), or a .ckpt"
        )
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return f"{kind}, not a checkpoint ({size:,} bytes)"
    if head[4:8] in (b"ftyp",) or (head.startswith(b"RIFF") and head[8:12] == b"WEBP"):
        return f"an image or video file, not a checkpoint ({size:,} bytes)"
    if head.startswith(b"\x80") and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (
            f"a Python pickle that torch.save did not write ({size:,} bytes), not a checkpoint: splitlab "
            "reads the zip archives torch.save writes"
        )
    text = as_text(head)
    if text is not None:
        return f"{what_text(file, text, size)}, not a checkpoint"
    return f"not a checkpoint torch can read ({size:,} bytes, beginning {head[:8].hex(' ')}){said}"


def what_zip(file: Path, size: int, said: str) -> str:
    """What a zip archive that torch could not read as a checkpoint is."""
    try:
        with zipfile.ZipFile(file) as archive:
            names = archive.namelist()
            if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                shown = ", ".join(names[:4]) + (f", ... ({len(names)} entries)" if len(names) > 4 else "")
                return (
                    f"a zip archive without data.pkl, not a torch checkpoint (it holds {shown or 'nothing'})"
                )
            damaged = archive.testzip()
    except zipfile.BadZipFile:
        return (
            f"truncated: {size:,} bytes of a checkpoint (a zip archive) whose end is missing, as a save "
            f"or a download cut short leaves it (a full disk, a killed job){said}"
        )
    except (OSError, EOFError) as err:
        return f"truncated or damaged: {size:,} bytes of a zip archive that stop reading ({err}){said}"
    if damaged is not None:
        return f"damaged: its entry {damaged} does not match its checksum ({size:,} bytes){said}"
    return f"a zip archive with data.pkl that torch cannot read ({size:,} bytes){said}"


def as_text(head: bytes) -> str | None:
    """``head`` as text when it reads as UTF-8 of printable characters (a multi-byte character cut
    at the end allowed), else None."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:
            return None
        text = head[: err.start].decode("utf-8")
    printable = sum(c.isprintable() or c in "\n\r\t" for c in text)
    return text if text and printable >= 0.95 * len(text) else None


def what_text(file: Path, text: str, size: int) -> str:
    """What kind of text file ``file`` (beginning with ``text``) is."""
    start = text.lstrip()
    if start.startswith("version https://git-lfs"):
        return "a Git LFS pointer (the checkpoint itself was never fetched: git lfs pull)"
    if start[:15].lower().startswith(("<!doctype html", "<html")):
        return "an HTML page (a download that saved a web page, e.g. a login or error page)"
    if start[:1] in ("{", "[") and size < 50_000_000:
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            pass
        else:
            return f"JSON text ({size:,} bytes)"
    first = start.splitlines()[0][:60] if start else ""
    return f"a text file ({size:,} bytes, beginning {first!r})"


DROPPED = object()  # what `plain` leaves out
PLAIN = (bool, int, float, complex, str, bytes, type(None))


def plain(value: Any, where: str = "", dropped: list[str] | None = None) -> Any:
    """``value`` made of what a weights-only read accepts: tensors, dicts, lists, tuples, sets,
    numbers, strings; dataclasses and namespaces as dicts, paths as strings, enums by value, NumPy
    values as tensors or numbers. Anything else is left out (`DROPPED`), its place and type added to
    ``dropped``."""
    dropped = [] if dropped is None else dropped
    if type(value) in PLAIN or isinstance(value, torch.Tensor | torch.dtype | torch.device | torch.Size):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "dtype"):  # before int / float: np.float64 is one
        try:
            return torch.as_tensor(value) if getattr(value, "shape", ()) else value.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    elif isinstance(value, enum.Enum):
        return plain(value.value, where, dropped)
    elif isinstance(value, pathlib.PurePath):
        return str(value)
    elif isinstance(value, PLAIN[:-1]):  # subclasses of str, int, ...: their plain value
        return next(kind for kind in PLAIN if isinstance(value, kind))(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif type(value).__name__ == "Namespace" and hasattr(value, "__dict__"):  # argparse's, jsonargparse's
        value = dict(vars(value))
    if isinstance(value, Mapping):
        out: dict[Any, Any] = OrderedDict() if isinstance(value, OrderedDict) else {}
        for key, item in value.items():
            if type(key) not in PLAIN:
                dropped.append(f"{where}[{key!r}] (a key of type {type(key).__qualname__})")
                continue
            kept = plain(item, f"{where}.{key}" if where else str(key), dropped)
            if kept is not DROPPED:
                out[key] = kept
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = [plain(v, f"{where}[{i}]", dropped) for i, v in enumerate(value)]
        items = [v for v in items if v is not DROPPED]
        return (
            items if isinstance(value, list) else (tuple(items) if isinstance(value, tuple) else set(items))
        )
    dropped.append(f"{where or 'the checkpoint'} (a {type(value).__module__}.{type(value).__qualname__})")
    return DROPPED


def convert_checkpoint(source: str | Path, target: str | Path) -> list[str]:
    """Read ``source`` in full (``weights_only=False``: it runs what the file holds; only for a file
    the user trusts) and write to ``target`` what a weights-only read accepts (`plain`); returns what
    was left out. ``target`` is never ``source`` nor an existing file, and is read back before this
    returns."""
    source, target = Path(source), Path(target)
    if not source.is_file():
        raise FileNotFoundError(f"convert-checkpoint {str(source)!r}: no such checkpoint file")
    if target.exists():
        raise FileExistsError(f"convert-checkpoint: {str(target)!r} exists; give a new file to write")
    folder = target.parent
    if not folder.is_dir():
        raise FileNotFoundError(
            f"convert-checkpoint: {str(folder)!r}, the folder of {str(target)!r}, does not exist"
        )
    if not os.access(folder, os.W_OK):
        raise PermissionError(
            f"convert-checkpoint: {str(folder)!r} cannot be written; give a file in a writable folder"
        )
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=False)  # the user trusts the file
    except Exception as err:  # what the readers say of the same file
        raise UnreadableCheckpoint(
            f"convert-checkpoint {str(source)!r} is not a readable checkpoint: {what_file(source, err)}"
        ) from None
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint or "splitlab" not in checkpoint:
        held = (
            f"a dict of {sorted(map(str, checkpoint))[:5]}"
            if isinstance(checkpoint, Mapping)
            else f"a {type(checkpoint).__qualname__}"
        )
        raise UnreadableCheckpoint(
            f"convert-checkpoint {str(source)!r} holds {held}, not a splitlab task's checkpoint (its state_dict "
            "and splitlab record): nothing to convert"
        )
    dropped: list[str] = []
    converted = plain(checkpoint, "", dropped)
    if converted is DROPPED:
        raise UnreadableCheckpoint(
            f"convert-checkpoint {str(source)!r}: holds a {type(checkpoint).__qualname__}, not a checkpoint's "
            "dict of weights and settings: nothing to convert"
        )
    partial = target.with_name(target.name + ".partial")
    try:
        torch.save(converted, partial)
        read_checkpoint(partial, "convert-checkpoint")
    except BaseException:  # a full disk, a stop: nothing partial left
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return dropped
