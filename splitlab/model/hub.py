"""How a `SplitModel` reads and writes its weights: the Hugging Face layout (``config.json`` +
``model.safetensors``) through ``huggingface_hub``'s mixin, so that ``save_pretrained``,
``from_pretrained`` and ``push_to_hub`` work as for any Hub model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from huggingface_hub import PyTorchModelHubMixin, hf_hub_download
from torch import Tensor

from splitlab.version import __version__

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
FIX_CONFIG = (
    "copy it again from where the model came from, or save the model again "
    "(model.save_pretrained(DIR), or splitlab export MODEL --format hf --out DIR)"
)


def read_config(path: Path) -> dict[str, Any]:
    """A saved model's ``config.json``, or one line naming the file when it is not one (a save cut
    short, an edit gone wrong): json's own error is a traceback that names no file."""
    text = path.read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        what = (
            "is empty"
            if not text.strip()
            else f"is not valid JSON ({err.msg}: line {err.lineno}, column {err.colno})"
        )
        raise ValueError(f"{path} {what}: the file was cut short or edited; {FIX_CONFIG}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"{path} holds a JSON {type(config).__name__}, not a model's settings (a JSON object); {FIX_CONFIG}"
        )
    return config


def file_in_the_way(path: Path) -> Path | None:
    """The file standing where ``path`` or one of its parent folders should be, or None."""
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            return part
    return None


class HubWeights(
    PyTorchModelHubMixin,
    library_name="splitlab",
    tags=["splitlab", "vision-transformer", "token-reduction", "mixed-resolution"],
    docs_url="https://github.com/splitlab/splitlab/blob/main/docs/inference.md",
):
    """Weights and files of a `SplitModel` (which supplies ``state_dict``, ``export_config``,
    ``rebuilt_keys`` and the ``registry`` of task classes)."""

    rebuilt_loaded = False  # weights for `rebuilt_keys` came from a file: save them too

    def load_weights(self, state: dict[str, Tensor], source: str) -> None:
        """Load a state dict, rebuilding the `rebuilt_keys` it leaves out; anything else missing or
        unexpected is an error naming ``source``."""
        own = self.state_dict()
        state = dict(state)
        rebuilt = self.rebuilt_keys()
        self.rebuilt_loaded = self.rebuilt_loaded or bool(rebuilt & set(state))
        for key in rebuilt:
            state.setdefault(key, own[key])
        wrong = [
            f"{k} {tuple(v.shape)} (this model: {tuple(own[k].shape)})"
            for k, v in state.items()
            if k in own and v.shape != own[k].shape
        ]
        if wrong:
            raise ValueError(
                f"{source}: weights of other sizes than its config builds: {'; '.join(wrong[:3])}"
            )
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{source}: its weights do not fit the model its config builds (missing {missing[:4]}, "
                f"unexpected {unexpected[:4]})"
            )

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> str | None:
        """Write ``config.json`` and ``model.safetensors`` (the Hugging Face layout; ``push_to_hub=True``
        and ``repo_id`` upload it), everything `from_pretrained` needs, into the folder
        ``save_directory`` (made if new); a file in its place is refused naming it."""
        blocking = file_in_the_way(Path(save_directory).expanduser())
        if blocking is not None:  # huggingface_hub's mkdir would raise a bare FileExistsError
            raise FileExistsError(
                f"save_pretrained({str(save_directory)!r}): {blocking} is a file, and a saved model is a folder "
                f"({CONFIG} + {WEIGHTS}) at that path: give the path of a new or existing folder instead"
            )
        return super().save_pretrained(save_directory, config=self.export_config(), **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *args: Any, **kwargs: Any) -> Any:
        """The model of a ``save_pretrained`` folder or a Hub id (``huggingface_hub``'s, with a broken
        local ``config.json`` named in one line)."""
        folder = Path(pretrained_model_name_or_path).expanduser()
        if folder.is_dir() and (folder / CONFIG).is_file():
            read_config(folder / CONFIG)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        from safetensors.torch import save_file

        skip = set() if self.rebuilt_loaded else self.rebuilt_keys()
        # cloned: tensors that share storage (tied weights) are written apart, as safetensors requires
        state = {
            k: v.detach().cpu().clone().contiguous() for k, v in self.state_dict().items() if k not in skip
        }
        save_file(
            state, str(Path(save_directory) / WEIGHTS), metadata={"format": "pt", "splitlab": __version__}
        )
        config = self.save_files(Path(save_directory), self.export_config())
        (Path(save_directory) / CONFIG).write_text(json.dumps(config, indent=2) + "\n")

    def save_files(self, directory: Path, config: dict[str, Any]) -> dict[str, Any]:
        """Write the files besides the weights that ``config`` refers to (VQA: a word-list tokenizer),
        and return the config that names them inside ``directory``."""
        return config

    @staticmethod
    def resolve_files(config: dict[str, Any], fetch: Any) -> dict[str, Any]:
        """``config`` with its file references resolved through ``fetch(name) -> local path``."""
        return config

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | Path | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        map_location: str = "cpu",
        config: dict[str, Any] | None = None,
        **ignored: Any,
    ) -> Any:
        if not config:
            raise FileNotFoundError(f"{model_id}: no config.json (not a folder written by save_pretrained)")

        def fetch(name: str) -> str:
            if os.path.isdir(model_id):
                path = Path(model_id) / name
                if not path.is_file():
                    raise FileNotFoundError(
                        f"{model_id}: no {name} (not a folder written by save_pretrained)"
                    )
                return str(path)
            return hf_hub_download(
                repo_id=model_id,
                filename=name,
                revision=revision,
                cache_dir=cache_dir,
                force_download=force_download,
                token=token,
                local_files_only=local_files_only,
            )

        from safetensors.torch import load_file

        task = config.get("task")
        if task not in cls.registry:
            raise ValueError(
                f"{model_id}: config.json names task={task!r}, not one of {sorted(cls.registry)}"
            )
        model_cls = cls.registry[task]
        model = model_cls(model_cls.resolve_files(dict(config), fetch))
        model.load_weights(load_file(fetch(WEIGHTS)), f"{model_id}/{WEIGHTS}")
        return model.to(map_location).eval()
