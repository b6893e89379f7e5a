"""What every diffusers family's components.py did alike, written once: the folder check of a family's
required files, loading a diffusers model class by name (frozen for a VAE), the NPU adaptation hook,
the handle of a Hugging Face text encoder, the module dtype and the per-sample sigma.

diffusers and transformers classes are named by string and imported inside the functions (the
families' modules are imported on both library lines; a class may exist on one line only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from fastvideo.models.base import check_diffusers_folder



def required_files(text_encoders: int = 1) -> dict[str, list[str]]:
    """The sub-folders of a diffusers image-model folder with ``text_encoders`` text encoders and the
    files that must be in each, in the folder's order: transformer, vae, text_encoder, tokenizer,
    text_encoder_2, tokenizer_2, ..., scheduler."""
    files = {"transformer": ["config.json"], "vae": ["config.json"]}
    for i in range(1, text_encoders + 1):
        suffix = "" if i == 1 else f"_{i}"
        files[f"text_encoder{suffix}"] = ["config.json"]
        files[f"tokenizer{suffix}"] = []
    files["scheduler"] = ["scheduler_config.json"]
    return files


# FLUX.2 [klein], Z-Image, Qwen-Image: one text encoder.
ONE_ENCODER_FILES = required_files(1)


# The model repositories on Hugging Face that are gated: the licence is accepted on the model's page and
# `huggingface-cli login` run before a download works (README's "Weights" table has a gated column;
# tests/models/test_model_weights_table.py holds the two equal).
GATED_MODEL_REPOS = frozenset({
    "black-forest-labs/FLUX.1-dev",  # FLUX.1 [dev] Non-Commercial License
    "black-forest-labs/FLUX.1-Kontext-dev",  # the same licence
    "black-forest-labs/FLUX.2-dev",  # FLUX [dev] Non-Commercial License
    "black-forest-labs/FLUX.2-klein-base-9B",  # FLUX Non-Commercial License (the 4B models are Apache-2.0)
    "black-forest-labs/FLUX.2-klein-9B",
    "stabilityai/stable-diffusion-3.5-medium",  # Stability AI Community License
})


def gated_note(repo: str) -> str:
    """' <repo> is gated: ...' for a gated repository, else ''."""
    if repo not in GATED_MODEL_REPOS:
        return ""
    return (f" {repo} is gated: accept its licence on https://huggingface.co/{repo} and run "
            "`huggingface-cli login` first.")


def download_hint(what: str, repo: str, family: str, tiny_args: str = "") -> str:
    """The line an error about a missing ``what`` folder ends with: the command that downloads ``repo``
    to data/<family> (and whether it is gated), or how to build the tiny test model."""
    return (f"Put a diffusers-layout {what} folder there (for example `huggingface-cli download {repo} "
            f"--local-dir data/{family}`).{gated_note(repo)} Or build a tiny test model with "
            f"`python -m fastvideo.tools.make_tiny_{family} data/{family}{tiny_args}`.")


def folder_checker(required: dict, hint: str, error: type, what: str) -> Callable[..., Path]:
    """check(path, components=None) -> Path: raise ``error`` naming every missing piece of ``path``'s
    ``components`` (default: all of ``required``) and ``hint`` (how to get the folder)."""

    def check(path: str | Path, components: tuple[str, ...] | None = None) -> Path:
        return check_diffusers_folder(path, required, hint, error, what, components)

    check.__doc__ = f"Raise {error.__name__} naming every missing piece of a {what} (default: all components)."
    return check


def load_diffusers_model(class_name: str, root, subfolder: str | None, dtype: torch.dtype):
    """diffusers' ``class_name``.from_pretrained(root, subfolder, torch_dtype=dtype)."""
    import diffusers

    return getattr(diffusers, class_name).from_pretrained(root, subfolder=subfolder, torch_dtype=dtype)


def load_transformer(class_name: str, check, adapt, root, subfolder, device, dtype):
    """The family's transformer from root/subfolder (checked first unless subfolder is None: a
    single-file layout), on ``device`` and adapted to it by ``adapt(model, device)``."""
    if subfolder is not None:
        check(root, (subfolder,))
    model = load_diffusers_model(class_name, root, subfolder, dtype).to(device)
    adapt(model, device)
    return model


def load_vae(class_name: str, check, path, device="cpu", dtype=torch.float32):
    """path/vae as diffusers' ``class_name``, frozen (no gradients, eval mode) on ``device``."""
    root = check(path, ("vae",))
    vae = load_diffusers_model(class_name, root, "vae", dtype)
    return vae.requires_grad_(False).eval().to(device)


def load_text_encoder(model_class: str, check, path, device="cpu", dtype=torch.float32):
    """(tokenizer, model): path/tokenizer through AutoTokenizer and path/text_encoder as transformers'
    ``model_class``, frozen (no gradients, eval mode) on ``device``."""
    import transformers

    root = check(path, ("text_encoder", "tokenizer"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(root, subfolder="tokenizer")
    model = getattr(transformers, model_class).from_pretrained(root, subfolder="text_encoder", torch_dtype=dtype)
    return tokenizer, model.requires_grad_(False).eval().to(device)


def adapt_for_npu(transformer, device, extra: Callable | None = None) -> None:
    """On an NPU: npu_ops' fused kernels (every RMS norm, FLUX's RoPE and attention processor) and
    then the family's ``extra(transformer)``; elsewhere nothing."""
    from fastvideo import devices

    if devices.is_npu(device):
        # Imported lazily: npu_ops is the one module besides fastvideo.devices allowed to name the NPU stack.
        from fastvideo.models import npu_ops

        npu_ops.maybe_adapt_for_npu(transformer, device)
        if extra is not None:
            extra(transformer)


class EncoderHandle:
    """Mixin of a text encoder's dataclass holding ``model`` (a Hugging Face decoder, without head):
    where it runs and how wide its hidden states are (a multimodal config's text_config's)."""

    model: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def hidden_size(self) -> int:
        config = self.model.config
        return int(getattr(getattr(config, "text_config", config), "hidden_size"))


def model_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype a diffusers module computes in (its ``dtype``, else its first parameter's)."""
    dtype = getattr(module, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(module.parameters()).dtype


def per_sample_sigma(sigma, batch: int, device) -> torch.Tensor:
    """sigma (a float, a 0-d tensor or per-sample [B]) as float32 [B] on ``device``."""
    sig = torch.as_tensor(sigma, dtype=torch.float32, device=device)
    return sig.expand(batch) if sig.ndim == 0 else sig.reshape(batch)


def cfg(config, key, default=None):
    """config[key] of a dict, config.key of a diffusers config object; ``default`` when absent."""
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)
