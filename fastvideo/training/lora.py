"""LoRA fine-tuning of the FLUX transformer through peft: injection, FSDP units, names.

    settings = LoraSettings.from_args(args)       # fastvideo/component_settings/lora.py -> TrainConfig.lora
    apply_lora(model, settings, base_dtype, seed) # builders.build_models, before wrap_model
    wrap_model(..., replicate_frozen=True)        # one FSDP unit per block: its adapters (base replicated)
    wrap_model(..., extra_units=is_adapter_unit)  # with CPU offload: each adapter Linear its own unit
    with adapters_disabled(model): ...            # the frozen base policy (KL reference)

Only the adapters (``lora_A`` / ``lora_B`` of the target Linears) are trainable. The base stays
frozen in the master dtype (float32 by default, as upstream's LoRA script; bf16 autocast computes
in bf16) or in bf16 with --lora_base_precision bf16 (half its memory), and the adapters are kept
in --master_weight_type, the optimizer's precision.

Names: peft injects in place, so inside the trainer an adapter is
``transformer_blocks.0.attn.to_q.lora_A.default.weight`` (that is what checkpoints hold); the
diffusers LoRA file format (``FluxPipeline.load_lora_weights``) is
``transformer.transformer_blocks.0.attn.to_q.lora_A.weight``. ``to_diffusers`` /
``from_diffusers`` convert, including the scale: diffusers 0.32 reads no alpha from a LoRA file and
applies scale 1, so an export multiplies ``lora_B`` by alpha / rank (exact for the default 256 /
128 = 2, a power of two).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from fastvideo.component_settings.lora import (  # noqa: F401  (re-exported: the settings' old home)
    DEFAULT_TARGETS,
    LORA_WEIGHTS_NAME,
    LoraSettings,
    lora_weights_file,
)
from fastvideo.errors import ConfigError

ADAPTER = "default"  # peft's adapter name; part of every in-model adapter parameter name
_IN_MODEL_KEY = re.compile(r"^(?P<module>.+)\.(?P<ab>lora_[AB])\.default\.weight$")
_DIFFUSERS_KEY = re.compile(r"^transformer\.(?P<module>.+)\.(?P<ab>lora_[AB])\.weight$")


# ---------------------------------------------------------------- injection
def apply_lora(model: nn.Module, s: LoraSettings, base_dtype: torch.dtype, adapter_dtype: torch.dtype,
               seed: int) -> None:
    """Freeze ``model`` in ``base_dtype`` and inject rank-``s.rank`` adapters (``adapter_dtype``,
    trainable) into the target Linears, in place. lora_A is drawn (peft's kaiming-uniform init)
    from a generator seeded with ``seed``, so every rank builds the same adapters whatever its
    global RNG did before; lora_B is zero, so the adapted model starts equal to the base."""
    from fastvideo.utils import require

    peft = require("peft", "lora", "--use_lora")
    model.requires_grad_(False)
    model.to(base_dtype)
    config = peft.LoraConfig(r=s.rank, lora_alpha=s.alpha, lora_dropout=s.dropout, init_lora_weights=True,
                             target_modules=list(s.target_modules))
    try:
        model.add_adapter(config, adapter_name=ADAPTER)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ConfigError(f"--lora_target_modules {','.join(s.target_modules)}: {exc}") from exc
    gen = torch.Generator().manual_seed(seed)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and _adapter_role(name) is not None:
            module.to(adapter_dtype)
            with torch.no_grad():
                if _adapter_role(name) == "lora_A":
                    w = torch.empty(module.weight.shape, dtype=torch.float32)
                    nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=gen)
                    module.weight.copy_(w)
                else:
                    module.weight.zero_()
            module.weight.requires_grad_(True)
    if s.init_weights:
        from fastvideo.utils import main_print

        try:
            state = from_diffusers(read_lora_file(s.init_weights), s.scale)
        except ValueError as exc:
            raise ConfigError(f"--resume_from_lora_checkpoint {s.init_weights}: {exc}") from exc
        load_adapter_weights(model, state)
        main_print(f"[lora] adapters start from {s.init_weights} at iteration 0; an upstream lora_optimizer.pt "
                   "(a pickle, which this project never loads) and step count are not restored. Resume a run of "
                   "this trainer exactly with --resume_from_lora_checkpoint latest")


def _adapter_role(module_name: str) -> str | None:
    """'lora_A' / 'lora_B' for peft's adapter Linears (``...to_q.lora_A.default``), else None."""
    parts = module_name.split(".")
    if len(parts) >= 2 and parts[-1] == ADAPTER and parts[-2] in ("lora_A", "lora_B"):
        return parts[-2]
    return None


def is_adapter_unit(module: nn.Module) -> bool:
    """FSDP wrap predicate: a Linear whose parameters are all trainable (an adapter matrix).

    Why each adapter Linear is its own FSDP unit: FSDP1 with flat parameters (use_orig_params=False,
    which the checkpoint code relies on, fastvideo/distributed/fsdp.py) needs every flat parameter
    uniform in requires_grad and dtype. A transformer-block unit holds the frozen bf16 base; its
    nested adapter units hold the trainable fp32 A and B. use_orig_params=True would accept the mix
    inside one block unit, but FSDP1 then allocates (sharded) gradients for the whole flat
    parameter, frozen base included, and it still refuses mixed dtypes. Upstream DanceGRPO makes
    the same choice (peft's fsdp_auto_wrap_policy, use_orig_params=False)."""
    params = list(module.parameters(recurse=False))
    return isinstance(module, nn.Linear) and bool(params) and all(p.requires_grad for p in params)


def peft_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` (wrapped or not) as the frozen base inside the block: the reference policy of
    the KL term without a second copy of the weights."""
    # peft's enable_adapters(False) also flips requires_grad of the adapter weights, which under
    # FSDP1 are the adapter units' flat parameters (whose gradient hooks FSDP registered once);
    # the flag the layers' forward reads is set directly instead.
    layers = peft_layers(model)
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield model
    finally:
        for layer in layers:
            layer._disable_adapters = False


# ---------------------------------------------------------------- names and files
def to_diffusers(adapter_state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """In-model adapter weights (checkpoint names) -> diffusers LoRA file entries, scale folded
    into lora_B (diffusers 0.32 loads a file at scale 1). Float32, contiguous."""
    out = {}
    for key, value in adapter_state.items():
        m = _IN_MODEL_KEY.match(key)
        if m is None:
            raise ValueError(f"{key!r} is not a LoRA adapter weight (expected '<module>.lora_A|B.{ADAPTER}.weight')")
        v = value.detach().float()
        out[f"transformer.{m['module']}.{m['ab']}.weight"] = (v * scale if m["ab"] == "lora_B" else v).contiguous()
    return out


def from_diffusers(file_state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Inverse of to_diffusers: a diffusers LoRA file at scale 1 -> in-model names for an adapter
    applied at ``scale``."""
    out = {}
    for key, value in file_state.items():
        m = _DIFFUSERS_KEY.match(key)
        if m is None:
            raise ValueError(f"{key!r} is not a FLUX transformer LoRA weight in diffusers format "
                             "('transformer.<module>.lora_A|B.weight')")
        v = value.float()
        out[f"{m['module']}.{m['ab']}.{ADAPTER}.weight"] = v / scale if m["ab"] == "lora_B" else v
    return out


def read_lora_file(spec: str | Path) -> dict[str, torch.Tensor]:
    """The diffusers-format entries, scale 1. Upstream's lora-checkpoint-N folders store their raw
    adapters (applied at lora_alpha / lora_rank by upstream) with that ratio in lora_config.json;
    they are brought to scale 1 here so that every file reads the same way."""
    from safetensors.torch import load_file

    path = lora_weights_file(spec)
    state = _fold_alphas(load_file(str(path)))
    upstream_cfg = path.parent / "lora_config.json"
    if upstream_cfg.is_file():
        params = json.loads(upstream_cfg.read_text(encoding="utf-8")).get("lora_params", {})
        if "lora_alpha" in params and "lora_rank" in params:
            s = float(params["lora_alpha"]) / float(params["lora_rank"])
            state = {k: (v.float() * s if ".lora_B." in k else v) for k, v in state.items()}
    return state


def _fold_alphas(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A file with ``transformer.<module>.alpha`` entries (a LoRA checkpoint of this trainer, read by
    diffusers at alpha / rank) brought to scale 1: lora_B times alpha / rank, alpha entries dropped."""
    alphas = {k.removesuffix(".alpha"): float(v) for k, v in state.items() if k.endswith(".alpha")}
    out = {k: v for k, v in state.items() if not k.endswith(".alpha")}
    for module, alpha in alphas.items():
        a_key, b_key = f"{module}.lora_A.weight", f"{module}.lora_B.weight"
        if a_key in out and b_key in out:
            out[b_key] = out[b_key].float() * (alpha / out[a_key].shape[0])
    return out


def load_adapter_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy in-model-named adapter weights into an (unwrapped) model; every adapter must be given."""
    params = dict(model.named_parameters())
    wanted = {k for k, p in params.items() if p.requires_grad}
    missing, unexpected = sorted(wanted - state.keys()), sorted(state.keys() - wanted)
    if missing or unexpected:
        raise ConfigError(f"the LoRA weights do not fit this model's adapters (check --lora_rank and "
                          f"--lora_target_modules): missing {missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for k, v in state.items():
            if params[k].shape != v.shape:
                raise ConfigError(f"LoRA weight {k}: shape {tuple(v.shape)}, the model's adapter is "
                                  f"{tuple(params[k].shape)} (different --lora_rank?)")
            params[k].copy_(v)


def merge_into_base(base_state: dict[str, torch.Tensor], adapter_state: dict[str, torch.Tensor],
                    scale: float) -> dict[str, torch.Tensor]:
    """W <- W + scale * B @ A for every adapted Linear, in float32, cast back to W's dtype.
    base_state: the base transformer's state dict; adapter_state: in-model adapter names."""
    out = dict(base_state)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in adapter_state.items():
        m = _IN_MODEL_KEY.match(key)
        if m is None:
            raise ValueError(f"{key!r} is not a LoRA adapter weight")
        pairs.setdefault(m["module"], {})[m["ab"]] = value.float()
    for module, ab in pairs.items():
        key = f"{module}.weight"
        if key not in out or set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"cannot merge the adapter of {module}: base weight or one of A/B is missing")
        w = out[key]
        out[key] = (w.float() + scale * (ab["lora_B"] @ ab["lora_A"])).to(w.dtype)
    return out


def lora_checkpoint_info(cfg) -> dict:
    """What a LoRA checkpoint records for export (--lora / --merge) besides its adapters: the
    settings and the base the adapters sit on. {} for full fine-tuning."""
    if not cfg.lora.enabled:
        return {}
    return {"lora": {**cfg.lora.to_json(), "base_model": cfg.model.pretrained_model_name_or_path,
                     "base_transformer": cfg.model.dit_model_name_or_path}}
