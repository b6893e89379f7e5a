"""The cost model's trajectory memory for FLUX.1 Kontext counts the source tensors each sample's
Conditioning carries (image_latents, source_ids, source_image), against the real Conditioning the
tiny Kontext encodes."""

from __future__ import annotations

import json

import torch

from fastvideo.models.flux.family import FluxFamily
from fastvideo.models.kontext.family import KontextFamily
from fastvideo.perf import memory

SEQ = 32


def test_cond_numel_counts_the_source_tensors(tiny_kontext_dir):
    family = KontextFamily(guidance_scale=2.5)
    config = json.loads((tiny_kontext_dir / "transformer" / "config.json").read_text())
    enc = family.load_text_encoders(tiny_kontext_dir)
    g = torch.Generator().manual_seed(0)
    pixels = (torch.rand(2, 3, 64, 48, generator=g) * 255).round() / 255  # a 64 x 48 target's source
    cond = family.encode_sources(enc, family.encode_prompts(enc, ["make it red", "add a cat"], SEQ), pixels)
    sample = sum(t[0].numel() for t in cond.tensors.values()) + cond.shared["source_ids"].numel()
    assert family.cond_numel_at(config, SEQ, 64, 48) == sample
    text = FluxFamily().cond_numel_at(config, SEQ, 64, 48)
    assert text == FluxFamily().cond_numel(config, SEQ) == cond["prompt_embeds"][0].numel() + cond["pooled"][0].numel()
    source = sample - text
    assert source == cond["image_latents"][0].numel() + cond["source_ids"].numel() + 3 * 64 * 48 > 0

    shape = memory.MemoryShape(height=64, width=48, text_tokens=SEQ, sampling_steps=4, samples_per_rank=6,
                               rollout_batch=2, micro_batch=2, world_size=1)
    grown = memory.trajectory_bytes(config, shape, family) - memory.trajectory_bytes(config, shape, FluxFamily())
    assert grown == 6 * source * 4  # fp32, every sample of the rank
