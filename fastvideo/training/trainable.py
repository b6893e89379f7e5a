"""--trainable_modules: which of the transformer's parameters full fine-tuning trains.

    select_trainable(model, "all", family_name)    # every parameter (the default, as before)
    select_trainable(model, "peer", family_name)   # the family's Flow-Factory set (PEER_MODULES)
    select_trainable(model, "attn.to_q,attn.to_k", family_name)  # module-name patterns

A pattern selects every parameter whose name contains it (Flow-Factory's rule,
``BaseAdapter._freeze_component``: ``any(target in name for target in trainable_modules)``), so
"attn.to_q" trains ``transformer_blocks.N.attn.to_q.weight`` and ``.bias`` of every block. The rest
of the transformer is frozen: no gradient, no optimizer state, no EMA shadow, but it is still saved
in the checkpoint (the whole model).

FSDP1 (flat parameters) needs each FSDP unit uniform in requires_grad: ``trainable_units`` makes each
largest fully-trainable module its own unit nested in its block (the LoRA layout with a sharded
base), so the block's and the root's units hold frozen parameters only. A selection that splits one
module's own parameters (a pattern naming ``.weight`` but not ``.bias``) is refused under FSDP1.
"""

from __future__ import annotations

from torch import nn

from fastvideo.errors import ConfigError

# Flow-Factory's default target modules per family (github.com/X-GenGroup/Flow-Factory at a0b2bc5,
# ``default_target_modules`` in src/flow_factory/models/: flux/flux1.py (flux), flux/flux1_kontext.py
# (kontext), flux/flux2.py and flux/flux2_klein.py (flux2: the same list for [dev] and [klein]),
# qwen_image/qwen_image.py (qwen_image), qwen_image/qwen_image_edit_plus.py (qwen_image_edit),
# stable_diffusion/sd3_5.py (sd3), z_image/z_image.py (zimage), wan/wan2_t2v.py (wan)). Its full
# fine-tuning yamls (examples/*/full/*/default.yaml) set ``target_modules: "default"``, except
# FLUX.2 [dev]'s (examples/grpo/full/flux2/t2i.yaml: the four attn.to_* of the image stream).
# tests/fixtures/flow_factory_target_modules.json holds the same lists as read from those files.
_ATTN = ("attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0")
_ADDED = ("attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out")
_FLUX2 = _ATTN + _ADDED + ("ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out",
                           "attn.to_qkv_mlp_proj")
PEER_MODULES: dict[str, tuple[str, ...]] = {
    "flux": _ATTN + _ADDED + ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"),
    "kontext": _ATTN + _ADDED + ("ff.net.0.proj", "ff_context.net.0.proj", "ff.net.2", "ff_context.net.2"),
    "flux2": _FLUX2,
    "flux2_edit": _FLUX2,  # klein editing: flux/flux2_klein.py's list, the model Flow-Factory's klein yamls edit with
    # img_mlp.net.2.proj / txt_mlp.net.2.proj name no module of diffusers' QwenImageTransformer2DModel
    # (net.2 is a Linear): the peer trains neither MLP's output projection.
    "qwen_image": _ATTN + _ADDED + ("img_mlp.net.0.proj", "img_mlp.net.2.proj", "txt_mlp.net.0.proj",
                                    "txt_mlp.net.2.proj"),
    "qwen_image_edit": ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                        "net.0.proj", "net.2"),
    "sd3": _ADDED + _ATTN,
    "zimage": ("attention.to_k", "attention.to_q", "attention.to_v", "attention.to_out.0", "feed_forward.w1",
               "feed_forward.w2", "feed_forward.w3"),
    "wan": ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
            "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"),
}
CHOICES = "all, peer (the family's Flow-Factory set) or a comma-separated list of module-name patterns"


def check_setting(value: str) -> None:
    """The flag's form (before any model exists): a non-empty choice or pattern list."""
    if not value.strip() or any(not p.strip() for p in value.split(",")):
        raise ConfigError(f"--trainable_modules {value!r}: give {CHOICES}")


def patterns(value: str, family_name: str) -> tuple[tuple[str, ...] | None, bool]:
    """(the patterns, whether each must match) of --trainable_modules for ``family_name``; (None, _)
    for all. The peer's lists name some modules a family lacks (Qwen-Image's net.2.proj), so only a
    user's own patterns must each match."""
    if value == "all":
        return None, False
    if value == "peer":
        if family_name not in PEER_MODULES:
            raise ConfigError(f"--trainable_modules peer: Flow-Factory has no default set for family "
                              f"{family_name!r} (known: {', '.join(sorted(PEER_MODULES))}); list the modules instead")
        return PEER_MODULES[family_name], False
    return tuple(p.strip() for p in value.split(",")), True


def select_trainable(model: nn.Module, value: str, family_name: str) -> tuple[int, int]:
    """Set requires_grad per --trainable_modules; (trained, total) parameter counts (elements).
    ConfigError (exit 2) for a pattern that matches no parameter, or a selection matching nothing."""
    found, must_match = patterns(value, family_name)
    named = list(model.named_parameters())
    if found is None:
        model.requires_grad_(True)
        return (total := sum(p.numel() for _, p in named)), total
    hits = {p: 0 for p in found}
    for name, param in named:
        chosen = [p for p in found if p in name]
        for p in chosen:
            hits[p] += 1
        param.requires_grad_(bool(chosen))
    missing = [p for p, n in hits.items() if n == 0]
    if (must_match and missing) or not any(hits.values()):
        raise ConfigError(f"--trainable_modules: {', '.join(missing)} matches no parameter of the {family_name} "
                          f"transformer (a pattern is part of a parameter name, e.g. attn.to_q); give {CHOICES}")
    trained = sum(p.numel() for _, p in named if p.requires_grad)
    return trained, sum(p.numel() for _, p in named)


def trainable_units(model: nn.Module):
    """FSDP1's extra-unit predicate for a partial selection: the largest modules whose parameters
    are all trainable. ConfigError when a trainable parameter lies outside every such module (one
    module's own parameters split between trained and frozen: FSDP1 flat parameters cannot)."""
    full = {id(m) for m in model.modules() if _all_trainable(m)}
    units = [m for name, m in model.named_modules() if id(m) in full and not _parent_full(model, name, full)]
    covered = {id(p) for m in units for p in m.parameters()}
    for name, param in model.named_parameters():
        if param.requires_grad and id(param) not in covered:
            raise ConfigError(f"--trainable_modules trains {name} but not all of its module's parameters: FSDP1 "
                              "flat parameters need whole modules; name the module, or use --fsdp_version 2")
    ids = {id(m) for m in units}
    return lambda module: id(module) in ids


def _all_trainable(module: nn.Module) -> bool:
    params = list(module.parameters())
    return bool(params) and all(p.requires_grad for p in params)


def _parent_full(model: nn.Module, name: str, full: set) -> bool:
    if not name:
        return False
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    return id(parent) in full
