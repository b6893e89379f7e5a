"""The model-family protocol: what the trainer, rollout, data, evaluation and cost model need
from a diffusion model, so that a second family plugs in without an edit elsewhere.

A family (``ModelFamily``) loads its parts from a folder, encodes prompts into an opaque
``Conditioning`` record, gives the latent geometry of a resolution (``LatentLayout``), predicts
the flow-matching velocity v(x, sigma, cond) on packed latents [B, L, C] and decodes them to
images. Everything model-specific (FLUX's pooled CLIP embedding and text ids, SD3's three text
encoders) stays behind it. Families are found by name in fastvideo.models.registry.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from fastvideo.index_copies import on
from fastvideo.errors import UserError

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
            return t[rows] if isinstance(rows, slice) else t[on(rows, t.device)]

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


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``key`` of a diffusers config: a Mapping (config.json's dict, FrozenDict) or a config object."""
    return config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)


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


def stored_tensors(folders: Mapping[str, str], negatives: bool = False) -> tuple[StoredTensor, ...]:
    """A StoredTensor for each name -> folder, under the videos2caption.json key "<folder>_path"; with
    ``negatives``, then the negative prompt's of each: "neg_<name>" in "negative_<folder>"."""
    pairs = list(folders.items())
    if negatives:
        pairs += [(f"neg_{name}", f"negative_{folder}") for name, folder in folders.items()]
    return tuple(StoredTensor(name, f"{folder}_path", folder) for name, folder in pairs)


def json_keys_of(storage: Sequence[StoredTensor]) -> tuple[str, ...]:
    """videos2caption.json's keys in ``storage``'s order, the caption last."""
    return tuple(s.json_key for s in storage) + ("caption",)


def storage_with(family: type, *names: str) -> tuple[tuple[StoredTensor, ...], tuple[str, ...]]:
    """(storage, json_keys) of ``family`` with the tensors ``names`` added (an editing family's source
    tensors), each in a folder of its name; the caption stays last."""
    added = stored_tensors({name: name for name in names})
    return family.storage + added, family.json_keys[:-1] + json_keys_of(added)


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


# ---------------------------------------------------------------- the family's roles
class FamilyLoading(abc.ABC):
    """Role: the family's parts from a diffusers-layout folder, and the blocks FSDP wraps."""

    # The transformer class an exported checkpoint names (config.json's _class_name).
    export_class_name: str = ""
    # Sub-folders a base model folder must hold to train.
    training_components: tuple[str, ...] = ()

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

    def meta_transformer(self, config: Mapping, dtype: torch.dtype) -> torch.nn.Module:
        """The transformer of ``config`` built on the meta device in ``dtype`` (no weights); default:
        transformer_class().from_config without the config's private keys."""
        with torch.device("meta"):
            model = self.transformer_class().from_config({k: v for k, v in config.items() if not k.startswith("_")})
        return model.to(dtype)

    def meta_model(self, folder: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, dict[str, Path]]:
        """(the model of the transformer folder ``folder`` on the meta device, {state-dict name prefix:
        the folder whose safetensors hold those names}); default: meta_transformer of its config.json,
        every name in ``folder`` (a family of several transformers, Wan2.2-A14B's experts, says more)."""
        return self.meta_transformer(self.transformer_class().load_config(folder), dtype), {"": Path(folder)}

    def trained_parts(self, model: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
        """The modules of ``model`` that train (LoRA's adapters go into each); the rest is frozen (no
        gradient, optimizer state or EMA shadow). Default: the whole model."""
        return (model,)

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

    def sequence_parallel_plan(self):
        """Its fastvideo.distributed.sequence_parallel.SequenceParallelPlan (the modules that
        split / gather the image tokens and its attention processor), or None: --sp_size 1 only."""
        return None

    def sequence_tokens(self, height: int, width: int, transformer_config: Mapping,
                        cond_dims: tuple | None = None) -> int | None:
        """The image tokens the sequence-parallel split divides in one forward at height x width
        (what --sp_size must divide), from a transformer config and the embeddings' dims
        (check_record's tuple of prompt 0, or None when unread); None: unknown (the split refuses
        at the first forward). Default: the nominal layout's tokens."""
        if not hasattr(self, "nominal_layout"):
            return None
        return self.nominal_layout(height, width, transformer_config).tokens[0]

    def cost_sequence_tokens(self, height: int, width: int, transformer_config: Mapping) -> int | None:
        """The split tokens the cost model's --sp_table counts at height x width: sequence_tokens
        with the embeddings the cost model assumes (an editing family's source of the target's
        size, as its meta_inputs). Default: sequence_tokens without embeddings."""
        return self.sequence_tokens(height, width, transformer_config)

    def attention_dims(self, transformer_config: Mapping) -> tuple[int, int]:
        """(attention heads, head dimension) of the transformer config: the sequence-parallel
        exchanges' width (perf.sequence_parallel). Default: diffusers' num_attention_heads and
        attention_head_dim."""
        return int(transformer_config["num_attention_heads"]), int(transformer_config["attention_head_dim"])

    def sequence_channels(self, transformer_config: Mapping) -> int:
        """Channels of one split token at the gather (the output projection's): out_channels (or
        in_channels) x patch_size^2."""
        channels = transformer_config.get("out_channels") or transformer_config["in_channels"]
        return int(channels) * int(transformer_config.get("patch_size") or 1) ** 2


class FamilyConditioning(abc.ABC):
    """Role: prompts -> Conditioning, and how preprocessing stores it and the dataset reads it back."""

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
    stored_dtypes: Mapping[str, torch.dtype] = {}  # stored in a fixed dtype (FLUX.2's ids), not the encoding's

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

    # Editing: each prompt carries a source image (a JSONL prompt file's "image",
    # fastvideo.data.sources) whose size's sides must be multiples of source_multiple; the family
    # says how it encodes it (encode_sources) and where its Conditioning keeps the pixels the
    # rewards see (source_images). Preprocessing adds "source_height" / "source_width" to
    # encoder_dims for record_shapes (and "source_references", the images a record gives).
    edits: bool = False
    # The reference images a record may give (a JSONL "image" list; FLUX.2 [klein] editing reads several)
    max_references: int = 1
    source_multiple: int = 16
    # The family whose model folders this one runs on (FLUX.2 [klein] editing: "flux2", klein's own
    # checkpoint); None: folders whose model_index.json names this family.
    runs_on: str | None = None
    # The area (pixels) an editing family resizes each source to, aspect kept, before its VAE
    # (preprocessing's --source_vae_size sets it through the constructor's ``vae_area``); None when it
    # encodes the source at its own size (Kontext).
    vae_area: int | None = None

    def check_source_size(self, height: int, width: int) -> None:
        """Raise a UserError (one line, the fix in it) for a source size the family's stock pipeline would
        refuse or resize (preprocessing asks before any model loads; default: every size is taken)."""

    def check_run_size(self, dims: tuple, height: int, width: int) -> None:
        """UserError (one line) when stored records of ``dims`` cannot make height x width clips (image-to-video's
        sources are their first frames); asked before any model loads. Default: every size is taken."""

    def encode_sources(self, encoders, cond: Conditioning, pixels: torch.Tensor) -> Conditioning:
        """``cond`` (P prompts) with what the family needs of their source images added: pixels
        [P, 3, H, W] float32 in [0, 1] on the encoders' device. Only an editing family has it."""
        raise NotImplementedError(f"model family {self.name!r} takes no source image")

    def source_images(self, cond: Conditioning) -> torch.Tensor | None:
        """The samples' source images [B, 3, H, W] float32 in [0, 1] (what the rewards are given
        beside the generated images; of several references, the first), or None for a text-to-image
        family (default)."""
        return None


class FamilySampling(abc.ABC):
    """Role: the latent geometry, the velocity the sampler integrates, and decoding."""

    def schedule_shift(self, height: int, width: int, sampling_steps: int) -> float | None:
        """The sigma schedule's shift the family's stock pipeline uses at this image size and step
        count (``--shift auto``), or None when its schedule does not depend on them (default)."""
        return None

    def schedule_terminal(self) -> float | None:
        """The stock scheduler's ``shift_terminal`` (diffusers' stretch of the shifted grid so that its
        last non-zero sigma is this value; Qwen-Image: 0.02), applied to the rollout's grid
        (sampling.plan.on_grid), or None when the scheduler does not stretch (default)."""
        return None

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) one velocity costs: 2 for a family that runs
        classifier-free guidance's conditional and unconditional rows (SD3 with guidance_scale > 1)."""
        return 1

    @abc.abstractmethod
    def layout(self, height: int, width: int, vae, transformer=None, device=None) -> LatentLayout:
        """Latent geometry; the token channels come from the transformer (without one: the VAE)."""

    @abc.abstractmethod
    def velocity(self, transformer, x: torch.Tensor, sigma, cond: Conditioning, layout: LatentLayout) -> torch.Tensor:
        """v(x, sigma) float32 [B, L, C] for packed latents x [B, L, C]; sigma float, 0-d or [B]."""

    @abc.abstractmethod
    def decode(self, vae, x0: torch.Tensor, layout: LatentLayout) -> torch.Tensor:
        """Packed latents [B, L, C] -> images [B, 3, H, W] float32 in [0, 1]."""


class FamilyCostModel(abc.ABC):
    """Optional role: the FLOP and memory shape the cost model (tools/cost_model.py, perf/) reads.
    A family without it trains; the cost model refuses it (require_cost_model)."""

    # The transformer config (diffusers keys) the cost model assumes when given none, the VAE
    # config whose decoder it counts, and the name it prints for them.
    reference_config: Any = None
    reference_vae_config: Any = None
    reference_name: str = ""

    def folder_cost_config(self, root: Path, config: dict) -> dict:
        """The transformer config the cost model counts for the model folder ``root`` whose
        transformer/config.json is ``config``; default: that config (a family of several transformers
        in one folder, Wan2.2-A14B's experts, says so here)."""
        return config

    @abc.abstractmethod
    def nominal_layout(self, height: int, width: int, transformer_config: Mapping) -> LatentLayout:
        """The layout with the family's standard VAE, from a transformer config alone (extras on the CPU)."""

    @abc.abstractmethod
    def blocks(self, transformer) -> list[torch.nn.Module]:
        """The transformer's repeated blocks in execution order (the cost model's FSDP units)."""

    @abc.abstractmethod
    def meta_inputs(self, config: Mapping, batch: int, layout: LatentLayout, text_tokens: int, dtype) -> dict:
        """Keyword arguments of one transformer forward, on the meta device (memory measurement)."""

    @abc.abstractmethod
    def cond_numel(self, config: Mapping, text_tokens: int) -> int:
        """Elements of one sample's Conditioning (the trajectory's memory)."""

    def cond_numel_at(self, config: Mapping, text_tokens: int, height: int, width: int) -> int:
        """Elements of one sample's Conditioning at this image size (perf.memory's trajectory): what
        cond_numel says, unless the conditioning grows with the image (an editing family's source
        tensors, assumed the target's size)."""
        return self.cond_numel(config, text_tokens)

    @abc.abstractmethod
    def transformer_flops(self, config, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
        """FLOPs of the transformer on a batch: "forward", "backward" (of that forward) and "blocks"
        (the share activation checkpointing recomputes), for perf.flops."""


class ModelFamily(FamilyLoading, FamilyConditioning, FamilySampling):
    """One diffusion-model family: the three roles a training run needs (a family that the cost
    model can size adds FamilyCostModel). Settings that change its forward (FLUX's guidance scale,
    timestep quantisation) are given to the constructor; a plugin family's own flags come as
    ``settings`` (its ``settings`` class's section, fastvideo.components)."""

    name: str = ""
    # Its settings class (a fastvideo.settings.Settings with a ``section``), or None.
    settings = None
    # The library line (fastvideo.library_lines) the family needs, None when it runs on both: the
    # registry refuses it elsewhere with one line naming the line and its install command.
    library_line: str | None = None
    # A video family's frame rate: its sample clips (MP4, fastvideo.video_io) play at it; None:
    # video_io.DEFAULT_FPS.
    video_fps: float | None = None


class NoCostModelError(UserError, ValueError):
    """The cost model was asked to size a family that has no FamilyCostModel role."""


def require_cost_model(family) -> FamilyCostModel:
    """``family`` itself when it plays the cost-model role, else NoCostModelError naming it."""
    if not isinstance(family, FamilyCostModel):
        raise NoCostModelError(f"model family {getattr(family, 'name', type(family).__name__)!r} has no cost model "
                               "(it does not implement fastvideo.models.base.FamilyCostModel): the FLOP and memory "
                               "estimates need it; training does not")
    return family
