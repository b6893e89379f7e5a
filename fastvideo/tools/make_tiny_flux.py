"""Write a complete diffusers-layout FLUX folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_flux OUT_DIR [--preset tiny|small] [--seed N]

Same config keys and structure as FLUX.1-dev (guidance embedding, 16 latent channels packed 2x2,
3-axis RoPE, CLIP pooled + T5 sequence text encoders, flow-matching scheduler) at a size that runs
on a laptop CPU. The same seed gives the same weights, bit for bit.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.tools.tiny_builder import (
    END_TOKEN,
    new_folder,
    run_builder_cli,
    save_tiny_folder,
    wake_zero_projections,
    write_clip_vocab,
)

# FLUX.1-dev's scheduler and VAE latent statistics, kept so tiny folders behave like the real one.
FLUX_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.32.0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
FLUX_VAE_SCALING = 0.3611
FLUX_VAE_SHIFT = 0.1159


@dataclass(frozen=True)
class Preset:
    num_layers: int
    num_single_layers: int
    attention_head_dim: int
    num_attention_heads: int
    axes_dims_rope: tuple[int, int, int]
    joint_attention_dim: int  # T5 d_model
    pooled_projection_dim: int  # CLIP hidden size
    t5_layers: int
    t5_ff: int
    clip_layers: int
    vae_channels: tuple[int, int, int, int]
    vae_groups: int


PRESETS = {
    # < 5 MB; a 64x64 image in well under a second on CPU.
    "tiny": Preset(1, 1, 16, 2, (4, 6, 6), 32, 32, 1, 64, 1, (8, 8, 8, 8), 4),
    # ~20 M parameters in the transformer: for benchmarks.
    "small": Preset(2, 4, 64, 6, (16, 24, 24), 256, 128, 2, 512, 2, (32, 32, 64, 64), 8),
}


def transformer_config(p: Preset) -> dict:
    return {
        "_class_name": "FluxTransformer2DModel",
        "_diffusers_version": "0.32.0",
        "patch_size": 1,
        "in_channels": 64,
        "out_channels": None,
        "num_layers": p.num_layers,
        "num_single_layers": p.num_single_layers,
        "attention_head_dim": p.attention_head_dim,
        "num_attention_heads": p.num_attention_heads,
        "joint_attention_dim": p.joint_attention_dim,
        "pooled_projection_dim": p.pooled_projection_dim,
        "guidance_embeds": True,
        "axes_dims_rope": list(p.axes_dims_rope),
    }


def vae_config(p: Preset) -> dict:
    return tiny_vae_config(p.vae_channels, p.vae_groups, FLUX_VAE_SCALING, FLUX_VAE_SHIFT)


def tiny_vae_config(channels, groups: int, scaling: float, shift: float) -> dict:
    """A 16-latent-channel AutoencoderKL config (FLUX.1's and SD3's layout) at the given widths,
    with the family's latent scaling / shift factors."""
    return {
        "_class_name": "AutoencoderKL",
        "_diffusers_version": "0.32.0",
        "act_fn": "silu",
        "block_out_channels": list(channels),
        "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4,
        "force_upcast": True,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 16,
        "latents_mean": None,
        "latents_std": None,
        "layers_per_block": 1,
        "mid_block_add_attention": True,
        "norm_num_groups": groups,
        "sample_size": 1024,
        "scaling_factor": scaling,
        "shift_factor": shift,
        "use_post_quant_conv": False,
        "use_quant_conv": False,
    }


def write_clip_tokenizer(out: Path) -> int:
    """A CLIP BPE tokenizer with single-character tokens and no merges. Returns the vocab size."""
    from transformers import CLIPTokenizer

    out.mkdir(parents=True, exist_ok=True)
    size = write_clip_vocab(out)
    # from_pretrained reads vocab.json + merges.txt on both library lines (transformers 5's
    # constructor takes the vocabulary itself, not its file).
    tok = CLIPTokenizer.from_pretrained(str(out), model_max_length=77, pad_token=END_TOKEN)
    tok.save_pretrained(out)
    return size


def write_t5_tokenizer(out: Path) -> int:
    """A T5-style (Unigram + Metaspace, '</s>' appended) fast tokenizer. Returns the vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    alphabet = string.ascii_letters + string.digits + string.punctuation
    pieces = [("\u2581" + c, -2.0) for c in alphabet] + [(c, -3.0) for c in alphabet] + [("\u2581", -4.0)]
    tk = Tokenizer(models.Unigram(specials + pieces, unk_id=2, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    fast = T5TokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        extra_ids=0, additional_special_tokens=[], model_max_length=512,
    )
    fast.save_pretrained(out)
    return tk.get_vocab_size()


def tiny_clip_config(vocab: int, width: int, layers: int):
    """A CLIPTextConfig for write_clip_tokenizer's vocabulary (its last two ids are BOS / EOS)."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=width,
        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
    )


def tiny_t5(vocab: int, width: int, ff: int, layers: int):
    """A T5EncoderModel for write_t5_tokenizer's vocabulary (pad 0, EOS 1)."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        vocab_size=vocab, d_model=width, d_kv=width // 4, d_ff=ff, num_layers=layers, num_heads=4,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1,
    ))


def build_modules(p: Preset, clip_vocab: int, t5_vocab: int, seed: int):
    """Instantiate every network of the folder with weights drawn from ``seed``."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel.from_config(transformer_config(p))
    vae = AutoencoderKL.from_config(vae_config(p))
    clip = CLIPTextModel(tiny_clip_config(clip_vocab, p.pooled_projection_dim, p.clip_layers))
    t5 = tiny_t5(t5_vocab, p.joint_attention_dim, p.t5_ff, p.t5_layers)
    wake_zero_projections(transformer, seed + 1)
    return transformer, vae, clip, t5


def make_tiny_flux(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    p = PRESETS[preset]
    out = new_folder(out_dir)
    clip_vocab = write_clip_tokenizer(out / "tokenizer")
    t5_vocab = write_t5_tokenizer(out / "tokenizer_2")
    modules = dict(zip(("transformer", "vae", "text_encoder", "text_encoder_2"),
                       build_modules(p, clip_vocab, t5_vocab, seed)))
    return save_tiny_folder(out, modules, FLUX_SCHEDULER_CONFIG, "FluxPipeline",
                            {"tokenizer": "CLIPTokenizer", "tokenizer_2": "T5TokenizerFast"})


def main(argv: list[str] | None = None) -> None:
    preset = ("--preset",), dict(
        default="tiny", choices=sorted(PRESETS),
        help="tiny: under 5 MB, a 64x64 image in well under a second on CPU (the demo and the tests); "
             "small: about 20 M transformer parameters, for benchmarks (default: tiny)")
    run_builder_cli("make_tiny_flux", __doc__, lambda a: make_tiny_flux(a.out_dir, a.preset, a.seed),
                    lambda a: f"{a.preset} FLUX", argv, options=(preset,))


if __name__ == "__main__":
    main()
