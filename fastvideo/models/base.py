"""The model-family protocol: what the trainer, rollout, data, evaluation and cost model need
from a diffusion model, so that a second family plugs in without an edit elsewhere.

A family (``ModelFamily``) loads its parts from a folder, encodes prompts into an opaque
``Conditioning`` record, gives the latent geometry of a resolution (``LatentLayout``), predicts
the flow-matching velocity v(x, sigma, cond) on packed latents [B, L, C] and decodes them to
images. Everything model-specific (FLUX's pooled CLIP embedding and text ids, SD3's three text
encoders) stays behind it. Families are found by name in a registry; "pkg.module:Name" imports a
plugin module first (which may register itself) and uses ``Name`` from it.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from fastvideo.errors import UserError

DEFAULT_FAMILY = "flux"


class UnknownModelFamilyError(UserError, ValueError):
    """--model_family names no registered family and no importable plugin."""


class EmbeddingDatasetError(UserError, ValueError):
    """The embedding index or one of its files is missing or malformed."""


class EmbeddingShapeError(EmbeddingDatasetError):
    """The embeddings do not fit the transformer (or each other)."""


# ---------------------------------------------------------------- conditioning
class Conditioning(abc.ABC):
    """Per-sample model inputs a family produces (encode_prompts) and consumes (velocity).

    Indexed by sample along dim 0; anything not indexed by sample is shared by all samples."""

    @abc.abstractmethod
    def select(self, rows) -> "Conditioning":
        """The samples at ``rows`` (a slice or an int64 index tensor), in that order."""

    @abc.abstractmethod
    def repeat_interleave(self, g: int) -> "Conditioning":
        """Each sample repeated g times in place (prompt p -> rows p*g .. p*g+g-1)."""

    @abc.abstractmethod
    def to(self, device) -> "Conditioning":
        ...

    @abc.abstractmethod
    def __len__(self) -> int:
        ...

    @abc.abstractmethod
    def to_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by name (per-sample ones [B, ...] and shared ones), for storage."""


@dataclass
class TensorConditioning(Conditioning):
    """A dict of per-sample tensors [B, ...] and a dict of shared tensors (e.g. FLUX's text ids)."""

    tensors: dict[str, torch.Tensor]
    shared: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        sizes = {name: t.shape[0] for name, t in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"per-sample tensors differ in batch size: {sizes}")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name] if name in self.tensors else self.shared[name]

    def select(self, rows) -> "TensorConditioning":
        def pick(t):
            return t[rows] if isinstance(rows, slice) else t[rows.to(t.device)]

        return TensorConditioning({k: pick(t) for k, t in self.tensors.items()}, dict(self.shared))

    def repeat_interleave(self, g: int) -> "TensorConditioning":
        return TensorConditioning({k: t.repeat_interleave(g, dim=0) for k, t in self.tensors.items()},
                                  dict(self.shared))

    def to(self, device) -> "TensorConditioning":
        return TensorConditioning({k: t.to(device) for k, t in self.tensors.items()},
                                  {k: t.to(device) for k, t in self.shared.items()})

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def to_tensors(self) -> dict[str, torch.Tensor]:
        return {**self.tensors, **self.shared}

    def record(self, i: int) -> dict[str, torch.Tensor]:
        """One sample's stored record: row i of each per-sample tensor, and the shared ones."""
        return {**{k: t[i] for k, t in self.tensors.items()}, **self.shared}


# ---------------------------------------------------------------- geometry and storage
@dataclass(frozen=True)
class LatentLayout:
    """The latent geometry of one resolution: images height x width <-> VAE latents of
    latent_hw = (h, w) cells <-> packed latents [B, L, C] with tokens = (L, C); ``extras`` holds
    what the family's velocity and decode need (FLUX: image_ids [L, 3] on the device, latent_h,
    latent_w)."""

    height: int
    width: int
    tokens: tuple[int, int]
    latent_hw: tuple[int, int]
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.extras[name]


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a prompt's stored record: its name in the Conditioning, the
    videos2caption.json key naming its file, and the folder that holds the file."""

    name: str
    json_key: str
    folder: str


# ---------------------------------------------------------------- folders
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def check_diffusers_folder(path: str | Path, required: Mapping[str, Sequence[str]], hint: str,
                           error_cls: type[Exception], label: str,
                           components: Sequence[str] | None = None) -> Path:
    """Check that ``path`` is a diffusers-layout folder (model_index.json) whose ``components``
    (default: every key of ``required``) are sub-folders holding their ``required`` files, weights
    (transformer, vae, text_encoder*) and tokenizer files. Raises ``error_cls`` naming every missing
    piece, ``label`` (e.g. "FLUX model folder") and ``hint`` (how to get one)."""
    root = Path(path)
    if not root.is_dir():
        raise error_cls(f"{label} {str(root)!r} does not exist. {hint}")
    problems = [] if (root / "model_index.json").is_file() else ["model_index.json"]
    for comp in components or tuple(required):
        sub = root / comp
        if not sub.is_dir():
            problems.append(f"{comp}/")
            continue
        problems += [f"{comp}/{name}" for name in required[comp] if not (sub / name).is_file()]
        if comp in ("transformer", "vae") or comp.startswith("text_encoder"):
            if not any(p.name.endswith(WEIGHT_SUFFIXES) for p in sub.iterdir()):
                problems.append(f"{comp}/<weights *.safetensors>")
        if comp.startswith("tokenizer") and not any(sub.iterdir()):
            problems.append(f"{comp}/<tokenizer files>")
    if problems:
        raise error_cls(f"{label} {str(root)!r} is incomplete; missing: {', '.join(problems)}. {hint}")
    return root


# ---------------------------------------------------------------- the family
class ModelFamily(abc.ABC):
    """One diffusion-model family. Settings that change its forward (FLUX's guidance scale,
    timestep quantisation) are given to the constructor."""

    name: str = ""
    # The transformer class an exported checkpoint names (config.json's _class_name).
    export_class_name: str = ""
    # Tensors stored per prompt, in the dataset item's order.
    storage: tuple[StoredTensor, ...] = ()
    # videos2caption.json's keys in the order they are written: each StoredTensor's json_key and "caption".
    json_keys: tuple[str, ...] = ()
    # Longest text sequence the encoders take (preprocessing refuses more).
    max_sequence_length_limit: int = 512
    # Sub-folders whose files determine the encodings (preprocessing's fingerprint), and those of
    # them holding an encoder config.json.
    text_components: tuple[str, ...] = ()
    text_encoder_components: tuple[str, ...] = ()
    # Sub-folders a base model folder must hold to train.
    training_components: tuple[str, ...] = ()

    # -- loading
    @abc.abstractmethod
    def check_folder(self, path: str | Path, components: tuple[str, ...] | None = None) -> Path:
        """Raise a UserError naming every missing piece of a model folder; return it as a Path."""

    def folder_error(self, message: str) -> Exception:
        """The error for a model folder that is not what the flags say (a UserError)."""
        return UserError(message)

    @abc.abstractmethod
    def transformer_class(self) -> type[torch.nn.Module]:
        ...

    @abc.abstractmethod
    def load_transformer(self, root: str | Path, subfolder: str | None, device, dtype: torch.dtype):
        """The transformer of ``root/subfolder`` (subfolder None: root is the transformer folder)."""

    @abc.abstractmethod
    def meta_transformer(self, config: Mapping, dtype: torch.dtype) -> torch.nn.Module:
        """The transformer of ``config`` built on the meta device in ``dtype`` (no weights)."""

    @abc.abstractmethod
    def adapt_for_device(self, transformer, device) -> None:
        """Device-specific kernels, applied before wrapping."""

    @abc.abstractmethod
    def load_vae(self, path: str | Path, device, dtype: torch.dtype):
        ...

    @abc.abstractmethod
    def load_text_encoders(self, path: str | Path, device, dtype: torch.dtype):
        ...

    @abc.abstractmethod
    def block_classes(self) -> tuple[type[torch.nn.Module], ...]:
        """The repeated blocks: FSDP units and activation-checkpointing units."""

    # -- conditioning
    @abc.abstractmethod
    def encode_prompts(self, encoders, prompts: list[str], max_sequence_length: int) -> Conditioning:
        ...

    @abc.abstractmethod
    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> Conditioning:
        """Stack per-prompt stored records (as read by the dataset) into one Conditioning."""

    def stored_record(self, record: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One prompt's record (Conditioning.record) as the preprocessing writes it, in the shapes
        of record_shapes; check_record reads it back (default: as it is)."""
        return dict(record)

    @abc.abstractmethod
    def check_record(self, idx: int, record: dict[str, torch.Tensor], first_dims: tuple | None = None,
                     where: str = "") -> tuple[dict[str, torch.Tensor], tuple]:
        """Validate (and normalise) prompt ``idx``'s stored record -> (record, its dims). first_dims:
        the dims of the dataset's first record (None for it), which this one must match; where:
        the folder, for the message. Raises EmbeddingShapeError."""

    @abc.abstractmethod
    def check_dims(self, dims: tuple, transformer_config, max_sequence_length: int | None = None) -> None:
        """Raise EmbeddingShapeError when stored records of ``dims`` do not fit the transformer."""

    @abc.abstractmethod
    def encoder_dims(self, encoders) -> dict[str, int]:
        """Widths of the encoders' outputs, for the stored records' expected shapes."""

    @abc.abstractmethod
    def record_shapes(self, max_sequence_length: int, encoder_dims: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """Expected shape of each stored tensor (``storage`` order)."""

    def check_cond(self, cond: Conditioning) -> None:
        """Raise ValueError when a prompt-level Conditioning is malformed (default: no check)."""

    def schedule_shift(self, height: int, width: int, sampling_steps: int) -> float | None:
        """The sigma schedule's shift the family's stock pipeline uses at this image size and step
        count (``--shift auto``), or None when its schedule does not depend on them (default)."""
        return None

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) one velocity costs: 2 for a family that runs
        classifier-free guidance's conditional and unconditional rows (SD3 with guidance_scale > 1)."""
        return 1

    # -- sampling
    @abc.abstractmethod
    def layout(self, height: int, width: int, vae, transformer=None, device=None) -> LatentLayout:
        """Latent geometry; the token channels come from the transformer (without one: the VAE)."""

    @abc.abstractmethod
    def nominal_layout(self, height: int, width: int, transformer_config: Mapping) -> LatentLayout:
        """The layout with the family's standard VAE, from a transformer config alone (cost model;
        extras on the CPU)."""

    @abc.abstractmethod
    def velocity(self, transformer, x: torch.Tensor, sigma, cond: Conditioning, layout: LatentLayout) -> torch.Tensor:
        """v(x, sigma) float32 [B, L, C] for packed latents x [B, L, C]; sigma float, 0-d or [B]."""

    @abc.abstractmethod
    def decode(self, vae, x0: torch.Tensor, layout: LatentLayout) -> torch.Tensor:
        """Packed latents [B, L, C] -> images [B, 3, H, W] float32 in [0, 1]."""

    # -- cost model
    @abc.abstractmethod
    def blocks(self, transformer) -> list[torch.nn.Module]:
        """The transformer's repeated blocks in execution order (the cost model's FSDP units)."""

    @abc.abstractmethod
    def meta_inputs(self, config: Mapping, batch: int, layout: LatentLayout, text_tokens: int, dtype) -> dict:
        """Keyword arguments of one transformer forward, on the meta device (memory measurement)."""

    @abc.abstractmethod
    def cond_numel(self, config: Mapping, text_tokens: int) -> int:
        """Elements of one sample's Conditioning (the trajectory's memory)."""

    @abc.abstractmethod
    def transformer_flops(self, config, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
        """FLOPs of the transformer on a batch: "forward", "backward" (of that forward) and "blocks"
        (the share activation checkpointing recomputes), for perf.flops."""

    # The transformer config (diffusers keys) the cost model assumes when given none, the VAE
    # config whose decoder it counts, and the name it prints for them.
    reference_config: Any = None
    reference_vae_config: Any = None
    reference_name: str = ""
    # The library line (fastvideo.library_lines) the family needs, None when it runs on both:
    # get_model_family refuses it elsewhere with one line naming the line and its install command.
    library_line: str | None = None


# ---------------------------------------------------------------- registry
_REGISTRY: dict[str, Callable[..., ModelFamily]] = {}


def register_model_family(name: str, factory: Callable[..., ModelFamily]) -> None:
    """Make ``get_model_family(name, **settings)`` call ``factory(**settings)``."""
    _REGISTRY[name] = factory


def model_family_names() -> list[str]:
    _ensure_builtin()
    return sorted(_REGISTRY)


def _ensure_builtin() -> None:
    # The built-in families register themselves on import.
    importlib.import_module("fastvideo.models.flux")
    importlib.import_module("fastvideo.models.sd3")
    importlib.import_module("fastvideo.models.flux2")


def get_model_family(name_or_path: str, **settings) -> ModelFamily:
    """A registered family by name, or "pkg.module:Name" (the module is imported first, so it can
    register itself; Name is a registered name or a ModelFamily factory in that module)."""
    _ensure_builtin()
    if ":" in name_or_path:
        module_name, _, attr = name_or_path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UnknownModelFamilyError(
                f"model family plugin {name_or_path!r}: cannot import {module_name!r} ({exc}); "
                f"built-in families: {', '.join(model_family_names())}"
            ) from None
        factory = _REGISTRY.get(attr) or getattr(module, attr, None)
        if factory is None:
            raise UnknownModelFamilyError(f"model family plugin {name_or_path!r}: {module_name} has no {attr!r}")
        _require_line(factory, name_or_path)
        return factory(**settings)
    if name_or_path not in _REGISTRY:
        raise UnknownModelFamilyError(
            f"unknown model family {name_or_path!r}; valid: {', '.join(model_family_names())} "
            "(or a plugin as pkg.module:Name)"
        )
    _require_line(_REGISTRY[name_or_path], name_or_path)
    return _REGISTRY[name_or_path](**settings)


def _require_line(factory, name: str) -> None:
    """Refuse a family whose class names a library line other than this environment's (before it
    is built: its module imports nothing of the line's libraries until then)."""
    line = getattr(factory, "library_line", None)
    if line is not None:
        from fastvideo.library_lines import require_line

        require_line(line, f"model family {name!r}")


def family_for_json_keys(keys) -> str | None:
    """The registered family whose videos2caption.json keys (``json_keys``) are exactly ``keys``;
    None when none, or more than one, has them (read from the classes, nothing is built)."""
    _ensure_builtin()
    wanted = set(keys)
    claimants = [name for name, factory in sorted(_REGISTRY.items())
                 if getattr(factory, "json_keys", None) and set(factory.json_keys) == wanted]
    return claimants[0] if len(claimants) == 1 else None


def family_for_class_name(class_name: str) -> str | None:
    """The registered family whose transformer class an exported config names (config.json's
    _class_name, e.g. a checkpoint's config.json); None when no family, or more than
    one, claims it (the class name alone cannot tell those apart)."""
    _ensure_builtin()
    claimants = []
    for name, factory in sorted(_REGISTRY.items()):
        # A family class says it without being built; other factories are built with no settings.
        claimed = getattr(factory, "export_class_name", None)
        if claimed is None:
            claimed = factory().export_class_name
        if claimed == class_name:
            claimants.append(name)
    return claimants[0] if len(claimants) == 1 else None
