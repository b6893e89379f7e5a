"""Shared by the patched-diffusers checks (check_<version>.py), which tests/test_patches.py runs as
scripts in subprocesses: ``reference`` mode with the stock diffusers of the line's interpreter, the
other modes with the patched tree first on PYTHONPATH.

    python check_<version>.py reference OUT.pt
    python check_<version>.py plain|broken|stub REF.pt SRC

plain: no torch_npu; broken: torch_npu installed but failing on import (no CANN); stub: the
stand-in torch_npu (tests/npu_stub.py) importable.
"""

from __future__ import annotations

import sys

import torch

MODES = ("plain", "broken", "stub")
TINY = dict(
    patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
    num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)


def parse_args() -> tuple[str, str, str | None]:
    """(mode, path, patched src or None) from argv."""
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "reference":
        return mode, path, None
    if mode not in MODES:
        raise SystemExit(f"mode must be reference or one of {MODES}, got {mode!r}")
    return mode, path, sys.argv[3]


def flux_ids(grid: int = 64, n_text: int = 512) -> torch.Tensor:
    """[n_text + grid^2, 3] FLUX position ids, text first (1024x1024 image: 64x64 latent grid)."""
    img = torch.zeros(grid * grid, 3)
    img[:, 1] = torch.arange(grid).repeat_interleave(grid)
    img[:, 2] = torch.arange(grid).repeat(grid)
    return torch.cat([torch.zeros(n_text, 3), img])


def randomise_norm_weights(model: torch.nn.Module) -> None:
    """diffusers initialises the q/k norm weights to ones; random ones make the norms matter."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".norm_" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)


def flux_inputs(h: int = 4, w: int = 4, n_text: int = 8) -> dict:
    img_ids = torch.zeros(h * w, 3)
    img_ids[:, 1] = torch.arange(h).repeat_interleave(w)
    img_ids[:, 2] = torch.arange(w).repeat(h)
    return {
        "hidden_states": torch.randn(2, h * w, TINY["in_channels"]),
        "encoder_hidden_states": torch.randn(2, n_text, TINY["joint_attention_dim"]),
        "pooled_projections": torch.randn(2, TINY["pooled_projection_dim"]),
        "timestep": torch.tensor([0.3, 0.8]),
        "guidance": torch.tensor([3.5, 3.5]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(n_text, 3),
    }


def joint_attention_inputs(model, inputs: dict) -> dict:
    """Inputs of the first joint block's attention: [2, 16, 32] image, [2, 8, 32] text, FLUX's RoPE."""
    return {
        "hidden_states": torch.randn(2, 16, 32),
        "encoder_hidden_states": torch.randn(2, 8, 32),
        "image_rotary_emb": model.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]])),
    }


def check(mode: str, name: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    """Same dtype and shape, and max |got - want| <= atol (printed)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype, got.shape, want.shape)
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= atol, f"{name}: max abs diff {diff} > {atol}"
    print(f"{mode} {name}: max abs diff {diff:.3g}")
