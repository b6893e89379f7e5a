"""The cost model on FLUX.2 [klein] (the current library line): the launchers' iteration FLOPs from
the per-pass count, and the 16-die launcher's memory verdict for klein 4B (docs/flux2.md)."""

from __future__ import annotations

import json

import pytest

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "FLUX.2 [klein]'s cost model")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
LAUNCH = ["--model_family", "flux2", "--h", "384", "--w", "384", "--sampling_steps", "8", "--num_generations", "16",
          "--sde_steps", "1", "--text_tokens", "512", "--gradient_checkpointing", "--json"]


def test_the_8_gpu_launchers_flops_count_both_guidance_passes(capsys):
    from fastvideo.models.flux2 import flops as F
    from fastvideo.tools import cost_model

    cost_model.main(LAUNCH + ["--prompts_per_rank", "6", "--world_size", "8"])
    out = json.loads(capsys.readouterr().out)
    one_pass = F.transformer_flops_breakdown(F.KLEIN_4B, 24 * 24, 512)["total"]
    assert out["flops"]["rollout"] == 8 * 8 * 6 * 16 * 2 * one_pass  # steps x samples x (cond + uncond)
    assert out["trained_steps"] == 1


@pytest.mark.slow  # traces klein 4B's forward and backward on the meta device
def test_memory_verdict_for_klein_4b_on_64gb_dies(capsys):
    """The 16-die launcher (full fine-tuning, full sharding, checkpointing): klein 4B's parameters as
    diffusers builds them, sharded 16 ways in fp32, and a verdict; without checkpointing it does not fit."""
    import torch
    from diffusers import Flux2Transformer2DModel

    from fastvideo.models.flux2.family import Flux2Family
    from fastvideo.tools import cost_model

    memory = ["--memory", "--prompts_per_rank", "3", "--world_size", "16", "--rollout_batch_size", "8",
              "--train_micro_batch_size", "4", "--gradient_accumulation_steps", "6", "--rewards", "pickscore:1.0",
              "--device", "npu", "--device_memory_gb", "64"]
    cost_model.main(LAUNCH + memory)
    out = json.loads(capsys.readouterr().out)
    with torch.device("meta"):
        params = sum(p.numel() for p in Flux2Transformer2DModel.from_config(Flux2Family().reference_config).parameters())
    assert out["model"] == "FLUX.2-klein-4B" and out["components"]["parameters"] == params * 4 // 16
    assert out["peak_bytes"] < 30e9 and out["verdict"].startswith("fits in 64 GB"), out["verdict"]
    cost_model.main([a for a in LAUNCH if a != "--gradient_checkpointing"] + ["--no-gradient_checkpointing"] + memory)
    assert json.loads(capsys.readouterr().out)["verdict"].startswith("does not fit in 64 GB")
