"""Wan image-to-video's cost model (--model_family wan_i2v): the analytic FLOPs (Wan's plus the CLIP image
tokens' of Wan2.1-I2V, models/wan/flops.py image_context_flops) equal FlopCounterMode's on the tiny
Wan2.1-I2V and Wan2.2-I2V-A14B transformers; the published image-to-video models by name
(models/wan/reference.py I2V_MODELS: diffusers' convert_wan_to_diffusers.py configs) have their sizes
and the latent grid of their clips. The current library line only."""

from __future__ import annotations

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Wan image-to-video's cost model")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
FRAMES, SIZE, SEQ = 5, 64, 512


def _real(inputs: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    return {k: (torch.rand(v.shape, generator=g) * 999 if k == "timestep" else
                torch.randn(v.shape, generator=g) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


@pytest.mark.parametrize("variant", ["i2v", "i2v_a14b"])
def test_transformer_flops_match_flop_counter(variant, tiny_wan_i2v_dir, tiny_wan_i2v_a14b_dir):
    """Forward and forward + backward on 2 clips of 5 frames at 64^2 with 512 text tokens (and 257 CLIP
    tokens where the transformer takes them): the analytic count equals the counter's exactly."""
    from diffusers import WanTransformer3DModel

    from fastvideo.models.wan_i2v.family import WanI2VFamily
    from fastvideo.perf.flops import count_flops

    folder = {"i2v": tiny_wan_i2v_dir, "i2v_a14b": tiny_wan_i2v_a14b_dir}[variant]
    model = WanTransformer3DModel.from_pretrained(folder, subfolder="transformer")
    family, config = WanI2VFamily(guidance_scale=1.0, num_frames=FRAMES), dict(model.config)
    layout = family.nominal_layout(SIZE, SIZE, config)
    inputs = _real(family.meta_inputs(config, 2, layout, SEQ, torch.float32))
    assert inputs["hidden_states"].shape == (2, 36, 2, 8, 8)
    assert ("encoder_hidden_states_image" in inputs) == (variant == "i2v")  # Wan2.2-I2V-A14B: no CLIP
    with torch.no_grad():
        fwd = count_flops(lambda: model(**inputs))
    fb = count_flops(lambda: model(**inputs)[0].square().mean().backward())
    counts = family.transformer_flops(config, layout.tokens[0], SEQ, 2)
    assert (counts["forward"], counts["forward"] + counts["backward"]) == (fwd, fb)
    assert ("image_attention" in counts) == (variant == "i2v")


def test_the_published_image_to_video_models_by_name():
    """--model wan2.1-i2v-14b-480p | -720p | wan2.2-i2v-a14b: the 14B's blocks with 36 input channels, Wan2.1's
    CLIP keys (add_k / add_v per block, the image embedder), Wan2.2-I2V-A14B's two experts at 0.9."""
    from fastvideo.models.wan.experts import WanExperts
    from fastvideo.models.wan_i2v.family import WanI2VFamily
    from fastvideo.tools.cost_model import resolve_model, set_num_frames

    family = WanI2VFamily(num_frames=5)
    set_num_frames(family, 81)
    sizes = {}
    for name in ("wan2.1-i2v-14b-480p", "wan2.1-i2v-14b-720p", "wan2.2-i2v-a14b"):
        config, _, _ = resolve_model(name, family)
        model = family.meta_transformer(config, torch.bfloat16)
        parts = model.experts() if isinstance(model, WanExperts) else (model,)
        sizes[name] = [sum(p.numel() for p in part.parameters()) for part in parts]
        assert family.nominal_layout(480, 832, config)["grid"] == (21, 60, 104)  # 81 frames, 8 pixels a cell
    assert sizes["wan2.1-i2v-14b-480p"] == sizes["wan2.1-i2v-14b-720p"]
    # per block add_k_proj, add_v_proj (5120 x 5120 + bias) and norm_added_k; the embedder's two LayerNorms and MLP
    clip = 40 * (2 * (5120 * 5120 + 5120) + 5120) + 2 * 1280 + (1280 * 1280 + 1280) + (1280 * 5120 + 5120) + 2 * 5120
    (one,), (high, low) = sizes["wan2.1-i2v-14b-480p"], sizes["wan2.2-i2v-a14b"]
    assert high == low and one - high == clip  # the CLIP keys, norms and embedder are all that differ
    assert round(high / 1e9, 2) == 14.29 and round(one / 1e9, 2) == 16.39
    assert resolve_model("wan2.2-i2v-a14b", family)[0]["two_experts"] == 0.9


# launcher, device, its memory (GB) -> the rollout's weights as --rollout_weights auto chooses them, the verdict
VERDICTS = [
    ("finetune_wan_i2v_14b_grpo_8gpus.sh", "cuda", 80, "gathered", "fits in 80 GB, with 16.7 GB to spare"),
    ("finetune_wan_i2v_14b_grpo_a3_16die.sh", "npu", 64, "gathered", "fits in 64 GB, with 11.9 GB to spare"),
    ("finetune_wan_i2v_a14b_grpo_8gpus.sh", "cuda", 80, "sharded", "fits in 80 GB, with 30.8 GB to spare"),
    ("finetune_wan_i2v_a14b_grpo_8gpus.sh", "cuda", 141, "gathered", "fits in 141 GB, with 49.5 GB to spare"),
    ("finetune_wan_i2v_a14b_grpo_a3_16die.sh", "npu", 64, "sharded", "fits in 64 GB, with 31.4 GB to spare"),
]


@pytest.mark.slow  # ~45 s of CPU a case: the memory model of one or two 14B transformers
@pytest.mark.parametrize("launcher, device, gb, rollout, verdict", VERDICTS)
def test_the_i2v_launchers_memory_verdicts(launcher, device, gb, rollout, verdict, capsys):
    """cost_model --memory on each image-to-video launcher's own flags (its DRY_RUN=1 command, the lean
    options of scripts/common.sh included) with the published model by name (docs/wan.md): 8 GPUs of 80 and
    141 GB, 16 dies of 64 GB; --rollout_weights auto keeps the weights gathered where that fits."""
    import json

    from fastvideo.tools.cost_model import main
    from fastvideo.tools.launcher_cost import launcher_args

    ranks, flags = launcher_args(f"scripts/finetune/{launcher}")
    model = "wan2.2-i2v-a14b" if "a14b" in launcher else "wan2.1-i2v-14b-480p"
    main(["--memory", "--json", "--world_size", str(ranks), "--device", device, "--device_memory_gb", str(gb),
          *flags, "--model", model])
    report = json.loads(capsys.readouterr().out)
    assert ranks == (16 if "a3_16die" in launcher else 8)
    assert report["verdict"] == verdict and report["lean"]["rollout_gathered"] == (rollout == "gathered")


def test_the_5b_image_to_video_costs_what_its_text_to_video_does():
    """--model_family wan_i2v --model wan2.2-ti2v-5b: one transformer for both tasks (expand_timesteps adds no
    channels or image tokens), so the image-to-video family's layout and FLOPs equal the text-to-video one's."""
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.models.wan_i2v.family import WanI2VFamily
    from fastvideo.tools.cost_model import resolve_model, set_num_frames

    i2v, t2v = WanI2VFamily(num_frames=5), WanFamily(num_frames=5)
    for family in (i2v, t2v):
        set_num_frames(family, 81)
    config, vae, _ = resolve_model("wan2.2-ti2v-5b", i2v)
    assert (config, vae) == resolve_model("wan2.2-ti2v-5b", t2v)[:2] and config["in_channels"] == 48
    layout = i2v.nominal_layout(704, 1280, config)
    assert layout["grid"] == t2v.nominal_layout(704, 1280, config)["grid"] == (21, 44, 80)  # 16 pixels a cell
    tokens = layout.tokens[0]
    assert i2v.transformer_flops(config, tokens, 512) == t2v.transformer_flops(config, tokens, 512)
