"""The shared part of the tiny builders (fastvideo/tools/tiny_builder.py): model_index.json as the
published checkpoints write it (the literal files of FLUX.1-dev, SD3.5, FLUX.2 [klein] / [dev],
Z-Image, Qwen-Image, Qwen-Image-Edit-2509 and FLUX.1 Kontext, key order included) and the command
line every builder shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastvideo.tools import tiny_builder

SCHED = ["diffusers", "FlowMatchEulerDiscreteScheduler"]
VAE, T = ["diffusers", "AutoencoderKL"], "transformers"
# The published model_index.json of each family (its _diffusers_version: the tiny scheduler's).
FLUX_INDEX = {"_class_name": "FluxPipeline", "_diffusers_version": "0.32.0", "scheduler": SCHED,
              "text_encoder": [T, "CLIPTextModel"], "text_encoder_2": [T, "T5EncoderModel"],
              "tokenizer": [T, "CLIPTokenizer"], "tokenizer_2": [T, "T5TokenizerFast"],
              "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": VAE}
SD3_INDEX = {"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.32.0", "scheduler": SCHED,
             "text_encoder": [T, "CLIPTextModelWithProjection"], "text_encoder_2": [T, "CLIPTextModelWithProjection"],
             "text_encoder_3": [T, "T5EncoderModel"], "tokenizer": [T, "CLIPTokenizer"],
             "tokenizer_2": [T, "CLIPTokenizer"], "tokenizer_3": [T, "T5TokenizerFast"],
             "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": VAE}
# FluxKontextPipeline's: FLUX.1's entries, then the two it adds.
KONTEXT_INDEX = {**FLUX_INDEX, "_class_name": "FluxKontextPipeline", "_diffusers_version": "0.42.1",
                 "feature_extractor": [None, None], "image_encoder": [None, None]}
FLUX2_VAE = ["diffusers", "AutoencoderKLFlux2"]
KLEIN_INDEX = {"_class_name": "Flux2KleinPipeline", "_diffusers_version": "0.42.1", "is_distilled": False,
               "scheduler": SCHED, "text_encoder": [T, "Qwen3ForCausalLM"], "tokenizer": [T, "Qwen2TokenizerFast"],
               "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": FLUX2_VAE}
ZIMAGE_INDEX = {"_class_name": "ZImagePipeline", "_diffusers_version": "0.42.1", "scheduler": SCHED,
                "text_encoder": [T, "Qwen3ForCausalLM"], "tokenizer": [T, "Qwen2TokenizerFast"],
                "transformer": ["diffusers", "ZImageTransformer2DModel"], "vae": VAE}
QWEN_INDEX = {"_class_name": "QwenImagePipeline", "_diffusers_version": "0.42.1", "scheduler": SCHED,
              "text_encoder": [T, "Qwen2_5_VLForConditionalGeneration"], "tokenizer": [T, "Qwen2Tokenizer"],
              "transformer": ["diffusers", "QwenImageTransformer2DModel"], "vae": ["diffusers", "AutoencoderKLQwenImage"]}

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers' (diffusers' convert_wan_to_diffusers.py: UniPC with flow sigmas, the
# umt5-xxl tokenizer); Wan2.2-TI2V-5B's adds WanPipeline's boundary_ratio, expand_timesteps, transformer_2.
WAN_INDEX = {"_class_name": "WanPipeline", "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": [T, "UMT5EncoderModel"],
             "tokenizer": [T, "T5TokenizerFast"], "transformer": ["diffusers", "WanTransformer3DModel"],
             "vae": ["diffusers", "AutoencoderKLWan"]}
WAN_TI2V_INDEX = {"_class_name": "WanPipeline", "_diffusers_version": "0.42.1", "boundary_ratio": None,
                  "expand_timesteps": True, "scheduler": WAN_INDEX["scheduler"], "text_encoder": WAN_INDEX["text_encoder"],
                  "tokenizer": WAN_INDEX["tokenizer"], "transformer": WAN_INDEX["transformer"],
                  "transformer_2": [None, None], "vae": WAN_INDEX["vae"]}
# Wan-AI/Wan2.2-T2V-A14B-Diffusers': two experts (transformer_2 a WanTransformer3DModel) and boundary_ratio 0.875.
WAN_A14B_INDEX = {**WAN_TI2V_INDEX, "boundary_ratio": 0.875, "expand_timesteps": False,
                  "transformer_2": WAN_INDEX["transformer"]}

# hunyuanvideo-community/HunyuanVideo's (Llama and CLIP text encoders, the flow-match Euler scheduler).
HUNYUAN_VIDEO_INDEX = {"_class_name": "HunyuanVideoPipeline", "_diffusers_version": "0.32.0.dev0", "scheduler": SCHED,
                       "text_encoder": [T, "LlamaModel"], "text_encoder_2": [T, "CLIPTextModel"],
                       "tokenizer": [T, "LlamaTokenizerFast"], "tokenizer_2": [T, "CLIPTokenizer"],
                       "transformer": ["diffusers", "HunyuanVideoTransformer3DModel"],
                       "vae": ["diffusers", "AutoencoderKLHunyuanVideo"]}


def _fake(module: str, name: str):
    """An object whose class is ``module.name`` (what model_index reads of a network)."""
    return type(name, (), {"__module__": module})()


def test_model_index_is_the_published_flux_file_with_its_key_order():
    modules = {"transformer": _fake("diffusers.models.transformers", "FluxTransformer2DModel"),
               "vae": _fake("diffusers.models.autoencoders", "AutoencoderKL"),
               "text_encoder": _fake("transformers.models.clip", "CLIPTextModel"),
               "text_encoder_2": _fake("transformers.models.t5", "T5EncoderModel")}
    scheduler = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.32.0"}
    index = tiny_builder.model_index("FluxPipeline", modules, scheduler,
                                     {"tokenizer_2": "T5TokenizerFast", "tokenizer": "CLIPTokenizer"})
    assert list(index.items()) == list(FLUX_INDEX.items())
    klein = tiny_builder.model_index("Flux2KleinPipeline", {}, scheduler, {}, is_distilled=True)
    assert list(klein) == ["_class_name", "_diffusers_version", "is_distilled", "scheduler"]


def _index(folder) -> list:
    return list(json.loads((Path(folder) / "model_index.json").read_text()).items())


def test_the_recipe_line_folders_have_the_published_model_index(tiny_flux_dir, tiny_sd3_dir, tiny_kontext_dir,
                                                                tiny_hunyuan_video_dir):
    assert _index(tiny_flux_dir) == list(FLUX_INDEX.items())
    assert _index(tiny_hunyuan_video_dir) == list(HUNYUAN_VIDEO_INDEX.items())  # both lines build it
    assert _index(tiny_sd3_dir) == list(SD3_INDEX.items())
    assert _index(tiny_kontext_dir) == list(KONTEXT_INDEX.items())


def test_the_current_line_folders_have_the_published_model_index(request):
    from fastvideo.library_lines import CURRENT, library_line

    if library_line() != CURRENT:
        pytest.skip("the current library line's builders")
    assert _index(request.getfixturevalue("tiny_flux2_dir")) == list(KLEIN_INDEX.items())
    assert _index(request.getfixturevalue("tiny_zimage_dir")) == list(ZIMAGE_INDEX.items())
    assert _index(request.getfixturevalue("tiny_qwen_image_dir")) == list(QWEN_INDEX.items())
    assert _index(request.getfixturevalue("tiny_wan_dir")) == list(WAN_INDEX.items())
    assert _index(request.getfixturevalue("tiny_wan_ti2v_dir")) == list(WAN_TI2V_INDEX.items())
    assert _index(request.getfixturevalue("tiny_wan_a14b_dir")) == list(WAN_A14B_INDEX.items())
    dev = dict(_index(request.getfixturevalue("tiny_flux2_dev_dir")))
    assert dev["_class_name"] == "Flux2Pipeline" and "is_distilled" not in dev
    assert dev["text_encoder"] == [T, "Mistral3ForConditionalGeneration"] and dev["tokenizer"] == [T, "PixtralProcessor"]


def test_the_builders_command_line_refuses_a_user_error_in_one_line(tmp_path, capsys):
    """A UserError from the build: exit 2, one line on stderr naming the tool; an abbreviated option
    is refused (allow_abbrev=False), not taken for another."""
    from fastvideo.errors import ConfigError

    def build(args):
        raise ConfigError(f"no folder for seed {args.seed}")

    with pytest.raises(SystemExit) as stop:
        tiny_builder.run_builder_cli("make_tiny_x", "Doc.\n", build, lambda a: "x", [str(tmp_path), "--seed", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err == ["make_tiny_x: error: no folder for seed 3"]
    with pytest.raises(SystemExit) as stop:
        tiny_builder.run_builder_cli("make_tiny_x", "Doc.\n", build, lambda a: "x", [str(tmp_path), "--se", "3"])
    assert stop.value.code == 2 and "unrecognized arguments: --se" in capsys.readouterr().err


def test_the_builders_command_line_prints_what_it_wrote(tmp_path, capsys):
    def build(args):
        (tmp_path / "f.bin").write_bytes(b"\0" * 20000)
        return tmp_path

    option = (("--variant",), {"default": "a"})
    tiny_builder.run_builder_cli("make_tiny_x", "Doc.\n", build, lambda a: f"tiny X [{a.variant}]",
                                 [str(tmp_path), "--variant", "b", "--seed", "5"], (option,), note=lambda a: ", noted")
    assert capsys.readouterr().out == f"wrote tiny X [b] folder to {tmp_path} (0.02 MB, seed 5, noted)\n"
