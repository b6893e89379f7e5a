"""The cost model's Qwen-Image-Edit: the source tokens (at the family's vae_area, preprocessing's
--source_vae_size) join the transformer's sequence in the FLOP count (equal to FlopCounterMode's on the
tiny transformer) and the trajectory counts the Conditioning's source tensors (against the tiny family's
real encoding); the text encoder's size is Qwen2.5-VL-7B's with its vision tower, built on the meta
device from its published config. The current library line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import json

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Qwen-Image-Edit (diffusers' QwenImageEditPlusPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
SEQ = 320

# Qwen/Qwen-Image-Edit-2509's text_encoder/config.json (Qwen2.5-VL-7B-Instruct's): the parameter shapes.
VL_7B_TEXT = dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944, num_attention_heads=28,
                  num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
VL_7B_VISION = dict(hidden_size=1280, intermediate_size=3420, num_heads=16, depth=32, out_hidden_size=3584,
                    fullatt_block_indexes=[7, 15, 23, 31], window_size=112, patch_size=14, spatial_merge_size=2,
                    temporal_patch_size=2, in_chans=3)


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    from fastvideo.tools.make_tiny_qwen_image_edit import make_tiny_qwen_image_edit

    return make_tiny_qwen_image_edit(tmp_path_factory.mktemp("tiny_qwen_image_edit"), seed=0)


def test_text_encoder_size_counts_the_vision_tower():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily

    config = Qwen2_5_VLConfig(text_config=VL_7B_TEXT, vision_config=VL_7B_VISION, tie_word_embeddings=False)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    assert total == 8_292_166_656 and vision == 676_550_144
    family = QwenImageEditFamily()
    assert abs(family.reference_text_encoder_params - total) / total < 1e-3
    assert family.reference_config == QwenImageFamily().reference_config  # the same 20B transformer


def test_flops_count_the_source_tokens(edit_dir):
    """A 64x64 target (16 tokens) with its source at a 64^2 VAE area (16 tokens) and at 384^2 (576):
    the analytic FLOPs equal FlopCounterMode's on the tiny transformer fed the cost model's inputs,
    and equal Qwen-Image's at the generated plus source tokens."""
    from diffusers import QwenImageTransformer2DModel

    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily
    from fastvideo.perf.flops import count_flops

    model = QwenImageTransformer2DModel.from_pretrained(edit_dir, subfolder="transformer")
    config = dict(model.config)
    g = torch.Generator().manual_seed(0)
    for area, source_tokens in ((64 * 64, 16), (384 * 384, 576)):
        family = QwenImageEditFamily(guidance_scale=1.0, vae_area=area)
        assert family.source_grid_at(64, 64)[0] * family.source_grid_at(64, 64)[1] == source_tokens
        meta = family.meta_inputs(config, 1, family.nominal_layout(64, 64, config), 19, torch.float32)
        inputs = {k: (torch.randn(v.shape, generator=g) if isinstance(v, torch.Tensor) else v) for k, v in meta.items()}
        assert inputs["hidden_states"].shape[1] == 16 + source_tokens
        with torch.no_grad():
            fwd = count_flops(lambda: model(**inputs))
        counts = family.transformer_flops(config, 16, 19)
        assert counts["forward"] == fwd
        assert counts == QwenImageFamily(guidance_scale=1.0).transformer_flops(config, 16 + source_tokens, 19)


def test_cond_numel_counts_the_source_tensors(edit_dir):
    """cond_numel_at equals the elements of one sample's real Conditioning (a 64x48 target and source
    at a 64^2 VAE area); the trajectory grows by them, fp32, for every sample of the rank."""
    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily
    from fastvideo.perf import memory

    family = QwenImageEditFamily(guidance_scale=4.0, vae_area=64 * 64)
    config = json.loads((edit_dir / "transformer" / "config.json").read_text())
    enc = family.load_text_encoders(edit_dir)
    pixels = (torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(0)) * 255).round() / 255
    cond = family.encode_sources(enc, family.encode_prompts(enc, ["make it red", "add a cat"], SEQ), pixels)
    sample = sum(t[0].numel() for t in cond.tensors.values()) + cond.shared["source_grid"].numel()
    assert family.cond_numel_at(config, SEQ, 64, 48) == sample
    assert cond["image_latents"].shape[1] == 16 and sample > 2 * SEQ * config["joint_attention_dim"]
    shape = memory.MemoryShape(height=64, width=48, text_tokens=SEQ, sampling_steps=4, samples_per_rank=6,
                               rollout_batch=2, micro_batch=2, world_size=1)
    grown = memory.trajectory_bytes(config, shape, family) - memory.trajectory_bytes(config, shape, QwenImageFamily())
    assert grown == 6 * (sample - QwenImageFamily().cond_numel_at(config, SEQ, 64, 48)) * 4


def test_source_vae_size_is_parsed_and_checked(capsys, tmp_path):
    """'SIDE' or 'H,W'; sides not positive multiples of 32, or the flag for a family that resizes no
    source, are one line and exit 2 before any model loads."""
    from fastvideo.data_preprocess.preprocess_embeddings import cli
    from fastvideo.data_preprocess.sources import source_size, source_vae_family

    assert source_size("384") == (384, 384) and source_size("384,256") == (384, 256)
    assert source_vae_family("qwen_image_edit", (384, 256)).vae_area == 384 * 256
    base = ["--prompt_dir", "assets/edit/prompts_edit.jsonl", "--output_dir", str(tmp_path / "out"),
            "--model_path", str(tmp_path / "absent")]
    for extra, words in ((["--model_family", "qwen_image_edit", "--source_vae_size", "400"], "multiple of 32"),
                         (["--model_family", "qwen_image_edit", "--source_vae_size", "384,0"], "multiple of 32"),
                         (["--model_family", "qwen_image_edit", "--source_vae_size", "-32"], "multiple of 32"),
                         (["--model_family", "kontext", "--source_vae_size", "384"], "resizes none")):
        assert cli(base + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_cost_model_flag_sizes_the_source_tokens(capsys):
    """cost_model --source_vae_size 384: its FLOPs are the family's at 576 source tokens, not the
    pipeline's 4096 (the default)."""
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily
    from fastvideo.tools import cost_model

    argv = ["--model_family", "qwen_image_edit", "--h", "384", "--w", "384", "--text_tokens", "512", "--json"]
    flops = {}
    for extra in ([], ["--source_vae_size", "384"]):
        cost_model.main(argv + extra)
        flops[tuple(extra)] = json.loads(capsys.readouterr().out)["forward_breakdown"]
    for extra, area in (((), 1024 * 1024), (("--source_vae_size", "384"), 384 * 384)):
        family = QwenImageEditFamily(vae_area=area)
        per = family.transformer_flops(family.reference_config, 576, 512)
        assert flops[extra] == {k: v for k, v in per.items() if k not in ("forward", "backward", "blocks")}
    assert flops[()] != flops[("--source_vae_size", "384")]


def test_sp_table_counts_the_source_tokens(capsys):
    """cost_model --sp_table for Qwen-Image-Edit: the split sequence is the 32 x 32 generated tokens of
    512^2 and the source's 64 x 64 (the pipeline's 1024^2 VAE area), 5120 tokens; the all-to-all and
    gather bytes are exchange_bytes' at 5120, not at the generated 1024."""
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily
    from fastvideo.perf.sequence_parallel import MIB, attention_layers, exchange_bytes
    from fastvideo.tools import cost_model

    family = QwenImageEditFamily()
    config = family.reference_config
    assert family.cost_sequence_tokens(512, 512, config) == 1024 + 4096
    cost_model.main(["--sp_table", "--model_family", "qwen_image_edit", "--h", "512", "--w", "512",
                     "--text_tokens", "64"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    heads, head_dim = family.attention_dims(config)
    layers = attention_layers(config, family)
    for row in rows[1:]:
        sp = int(row[0])
        a2a, gathered = exchange_bytes(heads * head_dim, family.sequence_channels(config), layers, 5120, 64, sp, 1, 2)
        generated_only = exchange_bytes(heads * head_dim, family.sequence_channels(config), layers, 1024, 64, sp, 1, 2)
        assert (row[3], row[4]) == (f"{a2a / MIB:.1f}", f"{gathered / MIB:.2f}") != \
            (f"{generated_only[0] / MIB:.1f}", f"{generated_only[1] / MIB:.2f}")
