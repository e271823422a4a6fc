"""`SplitModel`: the deployable SPLIT model, one plain `nn.Module` for every task.

Tokenizer (with its operating points, and APT's cuts when APT is the trained policy), `PackedViT`,
task head, names and preprocessing: everything inference needs, and the one deployed path
(`layout` -> `forward_layout`) that training's evaluation, ``bench``, ``predict``, ``export`` and
the scripts all run. The LightningModules in `splitlab.tasks` hold one (``task.model``) and add
what only training needs, as anomalib's Lightning models hold their torch model.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from splitlab.backbone import PackedFeatures, PackedViT
from splitlab.model.head_settings import NoSettings, head_config, settings_of
from splitlab.model.hub import HubWeights
from splitlab.model.preprocess import Preprocessing
from splitlab.model.record import holds, older_apt_budget, policy_state, unfinished
from splitlab.model.timm_wrap import timm_config
from splitlab.tokenizer import (
    BASELINES,
    DECISION_CONTEXTS,
    DECISION_DIM,
    DECISION_FEATURES,
    DECISION_HEADS,
    Levels,
    SplitTokenizer,
    TokenLayout,
    baseline_scores,
    cap_fraction,
    entropy_scores,
)
from splitlab.version import __version__

POLICIES = ("learned", "uniform", "entropy", "random")
# what a task can train and deploy; ``transferred`` deploys a learned policy another run trained
TRAINED_POLICIES = ("learned", "entropy", "random", "transferred")
# the policy a trained one deploys where the two differ: a transferred policy is a learned one
DEPLOYS = {"transferred": "learned"}
# the settings every SplitModel has (config.json's top level), with their defaults
COMMON: dict[str, Any] = {
    "backbone": "vit_tiny_patch16_224",
    "pretrained": False,
    "checkpoint_path": "",
    "backbone_kwargs": {},
    "levels": None,
    "decision_dim": DECISION_DIM,
    "decision_heads": DECISION_HEADS,
    "decision_context": DECISION_CONTEXTS[0],
    "decision_features": DECISION_FEATURES[0],
    "budget": 0.7,
    "budget_points": None,
    "max_fraction": None,
    "policy": "learned",
    "attn_backend": "auto",
    "names": None,
    "preprocessing": None,
    "trained": None,
    "calibration": None,
}


class SplitModel(nn.Module, HubWeights):
    """A trained SPLIT model: ``model(images, budget=None, max_fraction=None, policy=None)`` returns
    the task outputs and the `TokenLayout` they were computed on.

    Build one from a config (`from_config`: the right task class), load one with `splitlab.load`,
    `from_pretrained` or from a training checkpoint; `save_pretrained` writes the Hugging Face
    layout (``config.json`` + ``model.safetensors``), `push_to_hub` uploads it.

    Args:
        config: the settings (see ``COMMON``): the timm backbone and its kwargs, levels, decision
            module size, the budget points the policy was trained for and the one it deploys by
            default, the hard cap, the trained policy, names, preprocessing and the head's settings
            under ``head`` (the class's ``head_settings_class``, `splitlab.model.head_settings`).
    """

    task: ClassVar[str] = ""
    head_settings_class: ClassVar[type] = NoSettings  # its head's settings: config.json's ``head``
    square_input: ClassVar[bool] = True  # its preprocessing letterboxes into a square (not a classifier's)
    registry: ClassVar[dict[str, type[SplitModel]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("task"):  # a class that names its task (not a tracer's proxy subclass)
            SplitModel.registry[cls.task] = cls

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        cfg = {**copy.deepcopy(COMMON), **copy.deepcopy(dict(config)), "task": self.task}
        self.config = cfg
        self.set_head_settings(settings_of(self.head_settings_class, cfg.get("head"), "config head"))
        if cfg["policy"] not in POLICIES:
            raise ValueError(f"policy={cfg['policy']!r}: expected one of {POLICIES}")
        self.backbone = PackedViT(
            cfg["backbone"],
            pretrained=cfg["pretrained"],
            checkpoint_path=cfg["checkpoint_path"],
            attn_backend=cfg["attn_backend"],
            **cfg["backbone_kwargs"],
        )
        patch, size = self.backbone.patch_size, self.backbone.img_size
        if self.square_input and size[0] != size[1]:
            raise ValueError(
                f"model.init_args.backbone_kwargs.img_size={list(size)}: a {self.task or 'multi-task'} model "
                f"letterboxes images into a square, so give a square input (img_size: {max(size)}); "
                "non-square inputs are for classification"
            )
        levels = (
            Levels.default(patch, size)
            if cfg["levels"] is None
            else Levels.build(cfg["levels"], patch_size=patch)
        )
        levels.check_image(size)
        self.levels = levels
        budget = levels.check_fraction(cfg["budget"])
        points = [float(p) for p in (cfg["budget_points"] or [budget])]
        for name, choices in (
            ("decision_context", DECISION_CONTEXTS),
            ("decision_features", DECISION_FEATURES),
        ):
            if cfg[name] not in choices:
                raise ValueError(f"{name}={cfg[name]!r}: expected one of {choices}")
        self.tokenizer = SplitTokenizer(
            self.backbone.embed_dim,
            levels,
            cfg["decision_dim"],
            cfg["decision_heads"],
            budget_points=points,
            see_descendants=cfg["decision_context"] == "descendants",
            token_mlp=cfg["decision_features"] == "mlp",
        )
        self.tokenizer.operating_points.check(budget)
        self.cap_tokens(cfg["max_fraction"], "max_fraction")  # refused here, before any weights load
        self.check_cap(cfg["max_fraction"], budget)
        # APT's per-level entropy cuts in bits when it is the trained policy (coarse to fine: split
        # where entropy > cut), and the budget they were set for (-1: not set yet; a fit sets them
        # from entropy_thresholds or by a search on its calibration sample)
        self.register_buffer("apt_cuts", torch.zeros(levels.num - 1))
        self.register_buffer("apt_budget", torch.tensor(-1.0))
        self.register_load_state_dict_pre_hook(older_apt_budget)
        self.head = self.build_head(self.head_settings)
        self.policy: str = cfg["policy"]
        self.budget = budget
        given = cfg["preprocessing"]
        self.preprocessing = Preprocessing.from_dict(given) if given else self.default_preprocessing()
        sides = tuple(self.preprocessing.shape)
        if sides != tuple(size):  # a config.json edited by hand: which of the two would run is a guess
            raise ValueError(
                f"config preprocessing.img_size={list(sides)} contradicts backbone_kwargs.img_size={list(size)}: "
                "the model runs at the backbone's size; make both the same"
            )
        self.names: list[str] | None = list(cfg["names"]) if cfg["names"] else None
        # how far training went (`holds`): ``stage`` and ``ppo_steps``; empty for a model not trained
        # by a splitlab task (from_timm, or a file written before the record)
        self.trained: dict[str, Any] = dict(cfg["trained"] or {})
        # what `splitlab calibrate` last measured: ``budget``, ``images``, the held-out ``expected``
        # fraction, its standard ``error`` and the per-image ``spread`` (`splitlab.model.calibrate`)
        self.calibration: dict[str, Any] = dict(cfg["calibration"] or {})

    # ----------------------------------------------------------------------------- building
    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SplitModel:
        """The model of ``config["task"]`` (classification, detection, segmentation, vqa)."""
        task = config.get("task")
        if task not in SplitModel.registry:
            raise ValueError(f"config task={task!r}: expected one of {sorted(SplitModel.registry)}")
        return SplitModel.registry[task](dict(config))

    @classmethod
    def from_timm(
        cls,
        vit: nn.Module,
        levels: Sequence[int] | None = None,
        task: str = "classification",
        budget: float = COMMON["budget"],
        budget_range: Sequence[float] | None = None,
        **settings: Any,
    ) -> SplitModel:
        """A SPLIT model around a timm ViT you already have, its weights copied (for a training loop
        of your own; `splitlab.load` reads what its ``save_pretrained`` writes).

        The config names the timm architecture and the sizes read from ``vit`` (image and patch size,
        width, depth, heads), so the saved model rebuilds it; give ``backbone_kwargs`` for anything
        else you built it with. The decision module is new (untrained) and the cuts uncalibrated.

        Example:
            >>> vit = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, num_classes=4)
            >>> model = SplitModel.from_timm(vit, levels=[32, 16, 8], budget=0.5)
            >>> outputs, layout = model(torch.randn(2, 3, 64, 64))  # (2, 4) logits, a mixed layout

        Args:
            vit: a timm `VisionTransformer` or `Eva`.
            levels: patch sizes, coarse to fine, ending at the ViT's own (None: the default ladder).
            task: ``classification`` (the timm head), or another task whose head is new.
            budget: the budget deployed by default; ``budget_range``: a conditioned policy's range
                (``[lowest, highest]`` or ``[lowest, highest, step]``).
            **settings: further `SplitModel` settings (``decision_dim``, ``decision_context``,
                ``backbone_kwargs``, ``head``, ...).
        """
        # the parameters are built outside inference mode (a ViT built inside it is read, not trained)
        with torch.inference_mode(False):
            config, weights = timm_config(vit, levels, task, budget, budget_range, **settings)
            model = SplitModel.from_config(config)
            with torch.no_grad():
                model.backbone.model.load_state_dict(weights, strict=task == "classification")
            return model

    @classmethod
    def head_on(cls, shared: SplitModel, head: Any, names: Sequence[str] | None = None) -> SplitModel:
        """This task's model, with head settings ``head``, around ``shared``'s backbone and tokenizer
        (used, not copied): a member of a `SplitMultiTask`, which holds, moves and saves the shared
        parts once. A member gives its head, results and names; it is never deployed alone."""
        member = cls.__new__(cls)
        nn.Module.__init__(member)
        member.config = {
            **copy.deepcopy(shared.config),
            "task": cls.task,
            "names": list(names) if names else None,
        }
        member.set_head_settings(head)
        member.backbone, member.tokenizer, member.levels = shared.backbone, shared.tokenizer, shared.levels
        member.names = member.config["names"]
        member.head = member.build_head(member.head_settings)
        return member

    def set_head_settings(self, settings: Any) -> None:
        """The head's settings and config.json's ``head`` made from them: one writer, never apart."""
        self.head_settings = settings
        self.config["head"] = head_config(settings)

    def build_head(self, settings: Any) -> nn.Module | None:
        """The task head (None where the timm model's own head is used), from ``settings``, an
        instance of the class's ``head_settings_class``."""
        return None

    def default_preprocessing(self) -> Preprocessing:
        """Preprocessing before a data module says otherwise: the backbone's pretrained mean and std."""
        cfg = self.backbone.data_config
        return Preprocessing(
            self.backbone.img_size, tuple(cfg["mean"]), tuple(cfg["std"])
        )  # square: letterbox

    @property
    def max_tokens(self) -> int | None:
        """The hard cap (its one home: ``config["max_fraction"]``) as a count of finest cells."""
        return self.cap_tokens(self.config["max_fraction"])

    def cap_tokens(self, max_fraction: float | None, setting: str = "max_fraction") -> int | None:
        """A per-image cap on the token fraction as a token count of the finest grid (None: no cap)."""
        if max_fraction is None:
            return None
        self.levels.check_fraction(max_fraction, setting)
        rows, cols = (side // self.levels.finest for side in self.backbone.img_size)
        return int(max_fraction * rows * cols)

    def cap_limit(self, max_tokens: int | None = None) -> float | None:
        """The most token fraction a cap of ``max_tokens`` (default: the model's hard cap) leaves any
        image (None: no cap). The cap keeps whole splits, so this can fall just under
        ``max_fraction``; a budget above it is out of reach."""
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        if max_tokens is None:
            return None
        size, levels = self.backbone.img_size, self.levels
        coarse, finest = (math.prod(levels.grid(k, size)) for k in (0, levels.num - 1))
        return cap_fraction(max_tokens, coarse, finest)

    @staticmethod
    def check_cap(max_fraction: float | None, budget: float, budget_setting: str = "budget") -> None:
        """Refuse a hard cap below the deployed budget: every image would be held under the budget,
        so the mean could not meet it (measured: capped at 0.3, a budget of 0.5 realised 0.279). The
        one wording of this refusal: construction (the recipes), `set_deployment`, `check_call`."""
        if max_fraction is not None and float(max_fraction) < float(budget) - 1e-9:
            raise ValueError(
                f"max_fraction={float(max_fraction):g} is below {budget_setting}={float(budget):g}: a cap under the "
                "budget holds every image below it, so the budget cannot be met; raise max_fraction to at least "
                f"{budget_setting} (or lower {budget_setting})"
            )

    def set_deployment(self, budget: float | None = None, max_fraction: float | None = None) -> None:
        """Change the budget this model deploys by default and its hard cap (kept when saved)."""
        deployed = self.config["max_fraction"] if max_fraction is None else max_fraction
        self.check_cap(deployed, self.budget if budget is None else budget, "budget")
        if budget is not None:
            self.budget = self.tokenizer.operating_points.check(
                self.levels.check_fraction(budget, "budget"), "budget"
            )
        if max_fraction is not None:
            self.cap_tokens(max_fraction)  # a fraction out of range is refused before it is kept
            self.config["max_fraction"] = float(max_fraction)

    def export_config(self) -> dict[str, Any]:
        """The config that rebuilds this model as it is now (names, preprocessing, trained policy and
        default budget included); backbone weights come with the state dict, not from timm."""
        cfg = copy.deepcopy(self.config)
        cfg.update(
            pretrained=False,
            checkpoint_path="",
            budget=self.budget,
            policy=self.policy,
            names=self.names,
            preprocessing=self.preprocessing.to_dict(),
            attn_backend=self.backbone.attn_backend,
            splitlab_version=__version__,
            trained=dict(self.trained) or None,
            calibration=dict(self.calibration) or None,
        )
        return cfg

    @property
    def policy_state(self) -> str:
        """What the deployed policy is (`splitlab.model.record.policy_state`)."""
        return policy_state(self.policy, self.trained)

    def holds(self) -> str:
        """One line of what this model is: its policy's state, and the budgets its cuts were set for."""
        return holds(self.policy_state, self.trained, self.tokenizer.operating_points)

    def unfinished(self) -> str | None:
        """One line when this model's training stopped before PPO trained its policy (what to run), else None."""
        return unfinished(self.policy_state, self.holds())

    def rebuilt_keys(self) -> set[str]:
        """State-dict keys the model rebuilds identically from its config (a frozen LM loaded by
        name): saved files leave them out. None by default."""
        return set()

    # ----------------------------------------------------------------------------- the deployed path
    def check_policy(self, policy: str | None) -> str:
        """``policy`` (default: the trained one) if the model can run it, else a one-line error."""
        policy = self.policy if policy is None else policy
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r}: expected one of {POLICIES}")
        return policy

    def apt_ready(self, budget: float) -> bool:
        """Whether APT's fixed cuts are set for ``budget`` (``apt_budget`` is -1 until they are)."""
        return abs(float(self.apt_budget) - budget) < 1e-6

    def scores(
        self, policy: str, images: Tensor, budget: float, generator: torch.Generator | None = None
    ) -> tuple[list[Tensor], float]:
        """A baseline's split scores and cut at ``budget``, its pixel statistics read in the model's
        normalisation. APT as the trained policy splits at its fixed per-level cuts (``apt_cuts``),
        so each image's layout is its own; otherwise the cut is calibrated on this batch."""
        mean, std = self.preprocessing.mean, self.preprocessing.std
        if policy == "entropy" == self.policy and self.apt_ready(budget):
            levels = entropy_scores(images, self.levels, mean=mean, std=std)
            return [level - cut for level, cut in zip(levels, self.apt_cuts, strict=True)], 0.0
        if policy not in BASELINES:
            raise ValueError(f"policy={policy!r}: expected one of {POLICIES}")
        return baseline_scores(
            policy, images, self.levels, budget=budget, generator=generator, mean=mean, std=std
        )

    def binding_cap(self, policy: str, max_fraction: float | None = None) -> float | None:
        """The hard cap (a fraction) on a call of ``policy``: an explicit ``max_fraction``, else the
        model's, which binds the learned policy and the trained one only (a baseline row of a
        comparison meets the matched mean fraction, single images above the cap); None: no cap."""
        if max_fraction is not None:
            return float(max_fraction)
        return self.config["max_fraction"] if policy in ("learned", self.policy) else None

    def check_call(
        self,
        budget: float | Tensor | None = None,
        max_fraction: float | None = None,
        policy: str | None = None,
    ) -> str:
        """Refuse in one line what a call (`layout`, `predict`, an export) asks and cannot get, before
        any image is read; returns the policy it runs (default: the trained one).

        The budget (default: the model's) must be one the learned policy was trained for, and the cap
        that binds the call (`binding_cap`) not under it (`check_cap`). A per-image budget tensor is
        checked where it is drawn (reading it here would wait on the device); ``uniform`` meets no
        budget, so only its cap's range is checked."""
        policy = self.check_policy(policy)
        if max_fraction is not None:
            self.cap_tokens(max_fraction, "max_fraction")
        budget = self.budget if budget is None else budget
        if isinstance(budget, Tensor):
            return policy
        if policy == "learned":
            self.tokenizer.operating_points.check(budget, "budget")
        if policy != "uniform":
            self.check_cap(self.binding_cap(policy, max_fraction), budget, "budget")
        return policy

    def layout(
        self,
        images: Tensor,
        budget: float | Tensor | None = None,
        max_fraction: float | None = None,
        policy: str | None = None,
        seed: int = 0,
    ) -> TokenLayout:
        """The layout ``policy`` (default: the trained one) gives ``images`` at ``budget`` (default:
        the model's). The model's hard cap binds the learned policy and the trained one; another
        policy (a baseline row of a comparison) is capped only by an explicit ``max_fraction``. A cap
        below the budget is refused (`check_call`)."""
        policy = self.check_call(budget, max_fraction, policy)
        budget = self.budget if budget is None else budget
        max_tokens = self.cap_tokens(self.binding_cap(policy, max_fraction))
        if policy == "learned":
            return self.tokenizer(
                images, self.backbone, mode="threshold", budget=budget, max_tokens=max_tokens
            )
        generator = torch.Generator(images.device).manual_seed(seed)
        scores, threshold = self.scores(policy, images, float(budget), generator)
        return self.tokenizer(
            images, self.backbone, mode="scores", scores=scores, threshold=threshold, max_tokens=max_tokens
        )

    def backbone_indices(self) -> int | Sequence[int] | None:
        """Blocks whose outputs the head reads (dense heads, VQA); None for the final features only."""
        return None

    def forward_task(self, features: PackedFeatures) -> Any:
        """Task outputs from backbone features: the head's."""
        if self.head is None:
            raise NotImplementedError(f"{type(self).__name__} has no head: override forward_task")
        return self.head(features)

    def forward_layout(self, layout: TokenLayout) -> Any:
        """Task outputs of a layout: the packed backbone (with the blocks the head reads), the head."""
        return self.forward_task(self.backbone(layout, indices=self.backbone_indices()))

    def forward(
        self,
        images: Tensor,
        budget: float | Tensor | None = None,
        max_fraction: float | None = None,
        policy: str | None = None,
        seed: int = 0,
    ) -> tuple[Any, TokenLayout]:
        """Task outputs and the layout used (``seed`` drives the random policy)."""
        layout = self.layout(images, budget, max_fraction, policy, seed)
        return self.forward_layout(layout), layout

    # ----------------------------------------------------------------------------- results
    def results(self, outputs: Any, placements: Sequence[Any], **options: Any) -> list[dict[str, Any]]:
        """One JSON-friendly prediction per image, in the input images' own pixels."""
        raise NotImplementedError

    def predict(self, inputs: Any, **options: Any) -> list[dict[str, Any]]:
        """Predictions on file paths, PIL images or image tensors (see `splitlab.model.predict`)."""
        from splitlab.model.predict import predict

        return predict(self, inputs, **options)
