"""FLOPs of a video family's VAE decode: the family's causal video VAE (its ``meta_vae``) decoding one clip
on the meta device under torch's FlopCounterMode. perf.flops's AutoencoderKL formula is an image
decoder's; the video VAEs (AutoencoderKLWan, AutoencoderKLHunyuanVideo) decode frames through 3-D
convolutions with caches, which counting them by hand would copy layer by layer. On meta nothing is
computed: one clip at 81 frames 720p takes seconds of Python, and each shape is counted once a process."""

from __future__ import annotations

import json
from typing import Mapping

import torch

_COUNTED: dict[tuple, int] = {}


def measured_decode_flops(family, vae_config: Mapping, transformer_config: Mapping, height: int, width: int) -> int:
    """FLOPs of ``family``'s VAE decoding one clip of its num_frames at height x width (the latent grid of
    family.nominal_layout for ``transformer_config``)."""
    layout = family.nominal_layout(height, width, transformer_config)
    key = (type(family).__name__, json.dumps(dict(vae_config), sort_keys=True, default=str), tuple(layout["grid"]))
    if key not in _COUNTED:
        from torch.utils.flop_counter import FlopCounterMode

        vae, latents = family.meta_vae(dict(vae_config), 1, layout, torch.float32)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            vae.decode(latents)
        _COUNTED[key] = int(counter.get_total_flops())
    return _COUNTED[key]
