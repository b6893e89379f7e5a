"""Layer-wise probe: every chosen module's output for ONE fixed input, in execution order.

The article's checklist for garbled images ("check RoPE, attention, norm, VAE decode") done by a
program: run the same fixed input through the FLUX transformer and the VAE decoder on two
devices, save each module's output, and let ``compare_runs`` name the first module whose output
differs by more than its tolerance.

The input is built on the CPU from a fixed seed (so both devices see the same numbers) and then
moved to the device. Outputs are recorded by forward hooks when each module *returns*, so a
module's children come before the module itself and the first diverging entry is the innermost,
earliest place where the two implementations part.

Files (in ``out_dir``): ``probes.safetensors`` (float32 CPU copies, one key per output) and
``probes.json`` (the ordered entries: key, module, kind, shape, dtype; plus the input description).
A tuple output gives one entry per tensor: ``name`` for the first, ``name#i`` for position i;
a module called more than once gets ``@2``, ``@3``... on its later calls.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch

from fastvideo import devices
from fastvideo.component_settings.outputs import PROBE_KINDS
from fastvideo.errors import MissingInputError

PROBE_TENSORS = "probes.safetensors"
PROBE_INDEX = "probes.json"
PROBE_SUBDIR = "probes"  # where a recorded run keeps them: RECORD_DIR/probes/
FORMAT = "flux_grpo-probes"
VAE_PREFIX = "vae."

QK_NORM_NAMES = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
BLOCK_LISTS = ("transformer_blocks", "single_transformer_blocks")
# Segments that wrappers (FSDP, activation checkpointing, torch.compile) insert into module names.
_WRAPPER_SEGMENTS = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod", "module"}
# The decoder's mid block, each up block, and conv_out (the decoded image before clamping).
_VAE_BLOCK = re.compile(r"^decoder\.(mid_block|up_blocks\.\d+|conv_out)$")


@dataclass
class ProbeEntry:
    key: str  # tensor name in probes.safetensors
    module: str  # canonical module name (vae modules prefixed with "vae.")
    kind: str  # one of PROBE_KINDS
    shape: list[int]
    dtype: str  # dtype the module produced (the file holds float32 copies)


@dataclass
class ProbeInput:
    """The fixed probe input, float32 on the CPU.

    hidden_states [1, L, C] packed latents (L = (size/16)^2), encoder_hidden_states [1, Lt, D],
    pooled [1, P'], timestep [1] (a sigma in (0, 1)), guidance [1] or None, img_ids [L, 3],
    txt_ids [Lt, 3], vae_latent [1, z, size/8, size/8].
    """

    hidden_states: torch.Tensor | None
    encoder_hidden_states: torch.Tensor | None
    pooled: torch.Tensor | None
    timestep: torch.Tensor | None
    guidance: torch.Tensor | None
    img_ids: torch.Tensor | None
    txt_ids: torch.Tensor | None
    vae_latent: torch.Tensor | None
    description: dict = field(default_factory=dict)


@dataclass
class ProbeRecording:
    entries: list[ProbeEntry]
    tensors: dict[str, torch.Tensor]  # key -> float32 CPU tensor
    meta: dict


# ---------------------------------------------------------------------------------- selection


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a wrapper that keeps it as ``.module`` (FSDP1, DDP); else the model."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def canonical_name(name: str) -> str:
    """Module name without wrapper segments, so wrapped and plain models name modules alike."""
    return ".".join(p for p in name.split(".") if p and p not in _WRAPPER_SEGMENTS)


def transformer_module_kind(name: str, module: torch.nn.Module) -> str | None:
    """The probe kind of a transformer module (canonical ``name``), or None if it is not probed.

    Matched by name as well as class so that replaced implementations (the NPU RoPE and RMS
    norm modules) are probed under the same names as diffusers' originals.
    """
    parts = name.split(".")
    leaf = parts[-1] if parts else ""
    cls = type(module).__name__
    if leaf == "pos_embed" or cls.endswith("PosEmbed"):
        return "rope"
    if leaf in QK_NORM_NAMES or cls.startswith("AdaLayerNorm"):
        return "norm"
    if cls == "Attention" or _is_attention(module):
        return "attention"
    if len(parts) == 2 and parts[0] in BLOCK_LISTS and parts[1].isdigit():
        return "block"
    return None


def _is_attention(module: torch.nn.Module) -> bool:
    from fastvideo.library_lines import attention_module_classes

    return isinstance(module, attention_module_classes())


def select_modules(
    transformer: torch.nn.Module | None, vae: torch.nn.Module | None, kinds: Iterable[str]
) -> list[tuple[str, torch.nn.Module, str]]:
    """(canonical name, module, kind) of every module to probe, in registration order."""
    kinds = set(kinds)
    unknown = kinds - set(PROBE_KINDS)
    if unknown:
        raise ValueError(f"unknown probe kind(s) {sorted(unknown)}; valid: {', '.join(PROBE_KINDS)}")
    chosen: list[tuple[str, torch.nn.Module, str]] = []
    seen: set[int] = set()
    if transformer is not None and kinds - {"vae"}:
        names: set[str] = set()
        for raw, module in transformer.named_modules():
            name = canonical_name(raw)
            kind = transformer_module_kind(name, module) if name else None
            # One module per canonical name: an FSDP unit (transformer_blocks.0) and the block it
            # wraps (transformer_blocks.0._fsdp_wrapped_module) return the same tensor, which
            # was recorded twice and made safetensors refuse the file ("Some tensors share memory").
            if kind in kinds and id(module) not in seen and name not in names:
                seen.add(id(module))
                names.add(name)
                chosen.append((name, module, kind))
    if "vae" in kinds:
        if vae is None:
            raise ValueError("probe kind 'vae' needs a VAE; pass vae=...")
        for raw, module in vae.named_modules():
            name = canonical_name(raw)
            if _VAE_BLOCK.match(name) and id(module) not in seen:
                seen.add(id(module))
                chosen.append((VAE_PREFIX + name, module, "vae"))
    return chosen


# ---------------------------------------------------------------------------------- the input


def _cfg(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def build_probe_input(
    transformer_config=None, vae_config=None, seed: int = 0, size: int = 128, text_len: int = 16
) -> ProbeInput:
    """The fixed probe input for a FLUX transformer / VAE with these configs (float32, CPU).

    ``size`` is the image side in pixels (a multiple of 16); both configs may be None to skip
    that half. The same arguments give the same tensors on every machine (CPU generator).
    """
    from fastvideo.models import flux

    if size <= 0 or size % 16:
        raise ValueError(f"probe image size {size} must be a positive multiple of 16")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    lat = size // 8
    out = dict(hidden_states=None, encoder_hidden_states=None, pooled=None, timestep=None, guidance=None,
               img_ids=None, txt_ids=None, vae_latent=None)
    desc = {"seed": int(seed), "size": int(size), "text_len": int(text_len)}
    if transformer_config is not None:
        tokens = (lat // 2) ** 2
        channels = int(_cfg(transformer_config, "in_channels"))
        out["hidden_states"] = torch.randn(1, tokens, channels, generator=gen)
        out["encoder_hidden_states"] = torch.randn(1, text_len, int(_cfg(transformer_config, "joint_attention_dim")),
                                                   generator=gen)
        out["pooled"] = torch.randn(1, int(_cfg(transformer_config, "pooled_projection_dim")), generator=gen)
        out["timestep"] = torch.tensor([0.5])
        out["guidance"] = torch.tensor([3.5]) if _cfg(transformer_config, "guidance_embeds", False) else None
        out["img_ids"] = flux.image_ids(lat, lat)
        out["txt_ids"] = flux.text_ids(text_len)
        desc.update(tokens=tokens, timestep=0.5, guidance=3.5 if out["guidance"] is not None else None)
    if vae_config is not None:
        z = int(_cfg(vae_config, "latent_channels"))
        out["vae_latent"] = torch.randn(1, z, lat, lat, generator=gen)
        desc.update(vae_latent=[1, z, lat, lat])
    return ProbeInput(**out, description=desc)


# ---------------------------------------------------------------------------------- recording


class _OutputCollector:
    """Forward hooks appending each probed module's output, in the order modules return."""

    def __init__(self):
        self.entries: list[ProbeEntry] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self.calls: dict[str, int] = {}

    def hook(self, name: str, kind: str):
        def fn(module, args, output):
            self.calls[name] = self.calls.get(name, 0) + 1
            call = self.calls[name]
            base = name if call == 1 else f"{name}@{call}"
            items = output if isinstance(output, (tuple, list)) else (output,)
            first = True
            for pos, item in enumerate(items):
                if not isinstance(item, torch.Tensor):
                    continue
                key = base if first else f"{base}#{pos}"
                first = False
                # An own copy: outputs that are views of one storage (FSDP's flat parameters, a
                # module returning slices of one tensor, a float32 CPU output kept as is by
                # .float().cpu()) would make safetensors refuse them ("Some tensors share memory").
                self.tensors[key] = item.detach().to(device="cpu", dtype=torch.float32, copy=True).contiguous()
                dtype = str(item.dtype).replace("torch.", "")
                self.entries.append(ProbeEntry(key, name, kind, list(item.shape), dtype))

        return fn


def _param_dtype(module: torch.nn.Module) -> torch.dtype:
    dtype = getattr(module, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(module.parameters()).dtype


@torch.no_grad()
def _run_transformer(transformer: torch.nn.Module, inp: ProbeInput, device, dtype: torch.dtype) -> None:
    def on(t):
        return None if t is None else t.to(device=device, dtype=dtype)

    transformer(
        hidden_states=on(inp.hidden_states),
        encoder_hidden_states=on(inp.encoder_hidden_states),
        pooled_projections=on(inp.pooled),
        timestep=inp.timestep.to(device),
        img_ids=inp.img_ids.to(device),
        txt_ids=inp.txt_ids.to(device),
        guidance=None if inp.guidance is None else inp.guidance.to(device),
        return_dict=False,
    )


@torch.no_grad()
def _run_vae(vae: torch.nn.Module, inp: ProbeInput, device) -> None:
    vae.decode(inp.vae_latent.to(device=device, dtype=_param_dtype(vae)), return_dict=False)


def record_probes(
    transformer: torch.nn.Module | None,
    vae: torch.nn.Module | None,
    kinds: Sequence[str],
    out_dir: str | Path | None,
    seed: int = 0,
    size: int = 128,
    text_len: int = 16,
    device: torch.device | str | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> ProbeRecording:
    """Run the fixed input through ``transformer`` and decode a fixed latent with ``vae``,
    recording the outputs of the modules of ``kinds`` (see PROBE_KINDS) in execution order.

    The transformer may be wrapped (FSDP, activation checkpointing): the forward goes through the
    wrapper, so under FSDP every rank must call this; names are canonicalised. Runs in the
    modules' own dtype unless ``autocast_dtype`` is given. Writes probes.safetensors and
    probes.json to ``out_dir`` unless it is None. Returns the recording.
    """
    kinds = list(dict.fromkeys(kinds))
    if transformer is None and set(kinds) - {"vae"}:
        raise ValueError(f"probe kinds {sorted(set(kinds) - {'vae'})} need a transformer; pass transformer=...")
    inner = unwrap(transformer) if transformer is not None else None
    probe_transformer = transformer is not None and bool(set(kinds) - {"vae"})
    probe_vae = "vae" in kinds
    if probe_transformer is False and not probe_vae:
        raise ValueError(f"nothing to probe: kinds {kinds} need a transformer (rope/norm/attention/block) or 'vae'")
    if device is None:
        source = inner if probe_transformer else vae
        device = next(source.parameters()).device
    device = torch.device(device)
    inp = build_probe_input(
        inner.config if probe_transformer else None, vae.config if probe_vae else None, seed, size, text_len
    )
    collector = _OutputCollector()
    handles = [m.register_forward_hook(collector.hook(name, kind))
               for name, m, kind in select_modules(transformer if probe_transformer else None,
                                                    vae if probe_vae else None, kinds)]
    amp = devices.autocast(device, autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    try:
        with amp:
            if probe_transformer:
                _run_transformer(transformer, inp, device, _param_dtype(inner))
            if probe_vae:
                _run_vae(vae, inp, device)
    finally:
        for h in handles:
            h.remove()
    meta = {
        "format": FORMAT,
        "version": 1,
        "kinds": kinds,
        "input": inp.description,
        "device_type": device.type,
        "device_name": devices.device_name(device),
        "transformer_dtype": str(_param_dtype(inner)).replace("torch.", "") if probe_transformer else None,
        "vae_dtype": str(_param_dtype(vae)).replace("torch.", "") if probe_vae else None,
        "autocast_dtype": str(autocast_dtype).replace("torch.", "") if autocast_dtype is not None else None,
        "torch_version": torch.__version__,
    }
    recording = ProbeRecording(collector.entries, collector.tensors, meta)
    if out_dir is not None:
        save_probes(recording, out_dir)
    return recording


def save_probes(recording: ProbeRecording, out_dir: str | Path) -> Path:
    from safetensors.torch import save

    from fastvideo.alignment.recorder import atomic_write_bytes
    from fastvideo.utils import atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / PROBE_TENSORS, save(recording.tensors))
    index = dict(recording.meta, entries=[asdict(e) for e in recording.entries])
    atomic_write_json(out / PROBE_INDEX, index)
    return out


def load_probes(path: str | Path) -> ProbeRecording:
    """Read a probe folder (or a run folder holding probes/). Raises FileNotFoundError."""
    from safetensors.torch import load_file

    folder = find_probe_dir(path)
    if folder is None:
        raise MissingInputError(f"no {PROBE_INDEX} in {str(path)!r} or {str(Path(path) / PROBE_SUBDIR)!r}")
    index = json.loads((folder / PROBE_INDEX).read_text())
    tensors = load_file(str(folder / PROBE_TENSORS))
    entries = [ProbeEntry(**e) for e in index.pop("entries")]
    return ProbeRecording(entries, tensors, index)


def find_probe_dir(path: str | Path) -> Path | None:
    path = Path(path)
    for folder in (path, path / PROBE_SUBDIR):
        if (folder / PROBE_INDEX).is_file() and (folder / PROBE_TENSORS).is_file():
            return folder
    return None


def run_probes_for_config(cfg, model: torch.nn.Module, vae: torch.nn.Module | None, device) -> Path | None:
    """The trainer's hook: probe ``cfg.output.probe_layers`` once at set-up into
    RECORD_DIR/probes/. Call on every rank (a sharded model's forward is collective); rank 0
    writes. Runs in the models' own dtypes (no autocast): module-level mismatches stand out
    better than under bf16 rounding. Returns the folder on rank 0, else None."""
    kinds = cfg.output.probe_layers
    if not kinds:
        return None
    if not cfg.output.record_dir:
        raise ValueError("--probe_layers needs --record_dir (probe outputs are written there)")
    was_training = model.training
    model.eval()
    try:
        recording = record_probes(model, vae if "vae" in kinds else None, kinds, None, device=device)
    finally:
        model.train(was_training)
    if devices.rank() != 0:
        return None
    return save_probes(recording, Path(cfg.output.record_dir) / PROBE_SUBDIR)
