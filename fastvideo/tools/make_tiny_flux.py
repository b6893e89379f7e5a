"""Write a complete diffusers-layout FLUX folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_flux OUT_DIR [--preset tiny|small] [--seed N]

Same config keys and structure as FLUX.1-dev (guidance embedding, 16 latent channels packed 2x2,
3-axis RoPE, CLIP pooled + T5 sequence text encoders, flow-matching scheduler) at a size that runs
on a laptop CPU. The same seed gives the same weights, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import string
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.utils import atomic_write_json

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
    return {
        "_class_name": "AutoencoderKL",
        "_diffusers_version": "0.32.0",
        "act_fn": "silu",
        "block_out_channels": list(p.vae_channels),
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
        "norm_num_groups": p.vae_groups,
        "sample_size": 1024,
        "scaling_factor": FLUX_VAE_SCALING,
        "shift_factor": FLUX_VAE_SHIFT,
        "use_post_quant_conv": False,
        "use_quant_conv": False,
    }


def _bytes_to_unicode() -> dict[int, str]:
    """CLIP's reversible byte -> printable-character map (GPT-2 byte-level BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def write_clip_tokenizer(out: Path) -> int:
    """A CLIP BPE tokenizer with single-character tokens and no merges. Returns the vocab size."""
    from transformers import CLIPTokenizer

    out.mkdir(parents=True, exist_ok=True)
    symbols = list(_bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tok = CLIPTokenizer(
        str(out / "vocab.json"), str(out / "merges.txt"), model_max_length=77,
        pad_token="<|endoftext|>",
    )
    tok.save_pretrained(out)
    return len(tokens)


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


def build_modules(p: Preset, clip_vocab: int, t5_vocab: int, seed: int):
    """Instantiate every network of the folder with weights drawn from ``seed``."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel.from_config(transformer_config(p))
    vae = AutoencoderKL.from_config(vae_config(p))
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=clip_vocab, hidden_size=p.pooled_projection_dim,
            intermediate_size=2 * p.pooled_projection_dim, num_hidden_layers=p.clip_layers,
            num_attention_heads=2, max_position_embeddings=77, projection_dim=p.pooled_projection_dim,
            bos_token_id=clip_vocab - 2, eos_token_id=clip_vocab - 1, pad_token_id=clip_vocab - 1,
        )
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=t5_vocab, d_model=p.joint_attention_dim, d_kv=p.joint_attention_dim // 4,
            d_ff=p.t5_ff, num_layers=p.t5_layers, num_heads=4, feed_forward_proj="gated-gelu",
            is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1,
        )
    )
    # Random init leaves the transformer's output projections at zero (adaLN-zero style); give
    # them small values so the tiny model's velocity depends on its input and the RL has a signal.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if torch.count_nonzero(param) == 0 and param.ndim >= 1 and "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)
    return transformer, vae, clip, t5


def make_tiny_flux(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    p = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clip_vocab = write_clip_tokenizer(out / "tokenizer")
    t5_vocab = write_t5_tokenizer(out / "tokenizer_2")
    transformer, vae, clip, t5 = build_modules(p, clip_vocab, t5_vocab, seed)
    transformer.save_pretrained(out / "transformer", safe_serialization=True)
    vae.save_pretrained(out / "vae", safe_serialization=True)
    clip.save_pretrained(out / "text_encoder", safe_serialization=True)
    t5.save_pretrained(out / "text_encoder_2", safe_serialization=True)
    atomic_write_json(out / "scheduler" / "scheduler_config.json", FLUX_SCHEDULER_CONFIG)
    atomic_write_json(
        out / "model_index.json",
        {
            "_class_name": "FluxPipeline",
            "_diffusers_version": "0.32.0",
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "text_encoder_2": ["transformers", "T5EncoderModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "tokenizer_2": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "FluxTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        },
    )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="folder to write (created if missing)")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = make_tiny_flux(args.out_dir, args.preset, args.seed)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {args.preset} FLUX folder to {out} ({size / 1e6:.2f} MB, seed {args.seed})")


if __name__ == "__main__":
    main()
