"""Write a complete diffusers-layout HunyuanVideo folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_hunyuan_video OUT_DIR [--seed N]

Same structure and config keys as hunyuanvideo-community/HunyuanVideo, scaled down:
HunyuanVideoTransformer3DModel (the token refiner, dual-stream then single-stream blocks, 3-axis
RoPE, 1x2x2 patches, the guidance embedding), AutoencoderKLHunyuanVideo (the causal 3D VAE: 4x in
time, 8x in space, 16 latent channels, scaling_factor 0.476986), a LlamaModel text encoder with a
byte-level BPE tokenizer in LlamaTokenizerFast's class (Llama-3's pre-tokenising expression and
special tokens; merges make every piece of HunyuanVideoPipeline's prompt template one token, as
Llama-3's vocabulary does), a CLIPTextModel with make_tiny_flux's CLIP tokenizer (its pooled output is
the transformer's pooled projection input), and the published FlowMatchEulerDiscreteScheduler (shift
7.0). HunyuanVideoPipeline loads the folder on both library lines; the same seed gives the same
weights, bit for bit.

The template's prefix (up to the user's text) is 95 tokens here, BOS included: the pipeline's fixed
crop_start, so the cropped embeddings start at the prompt as with the real tokenizer. (On transformers
5, LlamaTokenizerFast replaces the byte-level pre-tokenizer; the family loads the file as
PreTrainedTokenizerFast: models/hunyuan_video/components.py load_llama_tokenizer.)
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux import tiny_clip_config, write_clip_tokenizer
from fastvideo.tools.make_tiny_flux2 import word_merges
from fastvideo.tools.tiny_builder import bytes_to_unicode, new_folder, run_builder_cli, save_tiny_folder, \
    wake_zero_projections

# hunyuanvideo-community/HunyuanVideo scheduler/scheduler_config.json.
SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.32.0.dev0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 7.0,
    "shift_terminal": None,
    "use_beta_sigmas": False,
    "use_dynamic_shifting": False,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}
# Llama-3's pre-tokenising expression (its tokenizer.json's Split) and the special tokens the template uses.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA_WIDTH, LLAMA_LAYERS = 32, 4  # text_embed_dim (4096 for llava-llama-3-8b); the pipeline reads layer -3
CLIP_WIDTH = 24  # pooled_projection_dim (768 for CLIP-L)
HEADS, HEAD_DIM = 2, 16  # transformer width 32 (24 x 128 in the 13B); RoPE axes 4 + 6 + 6 = HEAD_DIM


def template_pieces() -> list[str]:
    """The pieces Llama-3's expression splits HunyuanVideoPipeline's template into (ASCII text, so
    \\p{L} / \\p{N} are letters / digits), special tokens left out."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    text = DEFAULT_PROMPT_TEMPLATE["template"].replace("{}", "\x00")
    for special in SPECIALS:
        text = text.replace(special, "\x00")
    ascii_split = r"[^\r\n0-9A-Za-z]?[A-Za-z]+|[0-9]{1,3}| ?[^\s0-9A-Za-z]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    return [p for chunk in text.split("\x00") for p in re.findall(ascii_split, chunk)]


def piece_merges(pieces) -> list[tuple[str, str]]:
    """Merges that make each piece one token; pieces with a leading space first, so that their merges
    rank above a shorter word's inner pairs (" used" stays whole beside "user")."""
    ordered = sorted(set(pieces), key=lambda p: (not p.startswith(" "), len(p.encode()), p))
    return word_merges(ordered, bytes_to_unicode())


def write_llama_tokenizer(out: Path) -> int:
    """LlamaTokenizerFast (BOS prepended, right padding with <|end_of_text|>) over one token per byte,
    the template's merges and the letter pairs; returns its size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    space = bytes_to_unicode()[ord(" ")]
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = piece_merges(template_pieces())
    merges += [m for m in [(space, c) for c in letters] + [(a, b) for a in letters for b in letters] if m not in merges]
    symbols = list(bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(symbols + ["".join(m) for m in merges])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    tok = LlamaTokenizerFast(tokenizer_object=core, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
                             pad_token=SPECIALS[1], add_bos_token=True, add_eos_token=False,
                             model_max_length=131072, padding_side="right")
    tok.save_pretrained(out)
    return len(tok)


def transformer_config() -> dict:
    """HunyuanVideoTransformer3DModel at width 32 (the 13B: 24 heads of 128, 20 dual- and 40 single-stream
    blocks, 2 refiner blocks); the guidance embedding as the published CFG-distilled model."""
    return {
        "_class_name": "HunyuanVideoTransformer3DModel", "_diffusers_version": "0.32.0",
        "in_channels": 16, "out_channels": 16, "num_attention_heads": HEADS, "attention_head_dim": HEAD_DIM,
        "num_layers": 2, "num_single_layers": 2, "num_refiner_layers": 1, "mlp_ratio": 2.0,
        "patch_size": 2, "patch_size_t": 1, "qk_norm": "rms_norm", "guidance_embeds": True,
        "text_embed_dim": LLAMA_WIDTH, "pooled_projection_dim": CLIP_WIDTH, "rope_theta": 256.0,
        "rope_axes_dim": [4, 6, 6],
    }


def vae_config() -> dict:
    """AutoencoderKLHunyuanVideo 8 wide: four blocks, three spatial down-samplings, the middle two
    temporal (4x in time), 16 latent channels, the published scaling factor."""
    blocks = 4
    return {
        "_class_name": "AutoencoderKLHunyuanVideo", "_diffusers_version": "0.32.0",
        "in_channels": 3, "out_channels": 3, "latent_channels": 16,
        "down_block_types": ["HunyuanVideoDownBlock3D"] * blocks, "up_block_types": ["HunyuanVideoUpBlock3D"] * blocks,
        "block_out_channels": [8, 8, 16, 16], "layers_per_block": 1, "act_fn": "silu", "norm_num_groups": 4,
        "scaling_factor": 0.476986, "spatial_compression_ratio": 8, "temporal_compression_ratio": 4,
        "mid_block_add_attention": True,
    }


def tiny_llama(vocab: int):
    """LlamaModel (the text encoder's class in the published folder), 32 wide, 4 layers."""
    from transformers import LlamaConfig, LlamaModel

    return LlamaModel(LlamaConfig(
        vocab_size=vocab, hidden_size=LLAMA_WIDTH, intermediate_size=2 * LLAMA_WIDTH, num_hidden_layers=LLAMA_LAYERS,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, rms_norm_eps=1e-5,
        rope_theta=500000.0, bos_token_id=vocab - len(SPECIALS), eos_token_id=vocab - len(SPECIALS) + 1,
        pad_token_id=vocab - len(SPECIALS) + 1, tie_word_embeddings=False))


def build_modules(llama_vocab: int, clip_vocab: int, seed: int):
    """Every network of the folder, weights drawn from ``seed``."""
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoTransformer3DModel
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel.from_config(transformer_config())
    vae = AutoencoderKLHunyuanVideo.from_config(vae_config())
    llama = tiny_llama(llama_vocab)
    clip = CLIPTextModel(tiny_clip_config(clip_vocab, CLIP_WIDTH, 2))
    wake_zero_projections(transformer, seed + 1)
    return transformer, vae, llama, clip


def make_tiny_hunyuan_video(out_dir: str | Path, seed: int = 0) -> Path:
    out = new_folder(out_dir)
    llama_vocab = write_llama_tokenizer(out / "tokenizer")
    clip_vocab = write_clip_tokenizer(out / "tokenizer_2")
    modules = dict(zip(("transformer", "vae", "text_encoder", "text_encoder_2"),
                       build_modules(llama_vocab, clip_vocab, seed)))
    return save_tiny_folder(out, modules, SCHEDULER_CONFIG, "HunyuanVideoPipeline",
                            {"tokenizer": "LlamaTokenizerFast", "tokenizer_2": "CLIPTokenizer"})


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_hunyuan_video", __doc__, lambda a: make_tiny_hunyuan_video(a.out_dir, a.seed),
                    lambda a: "tiny HunyuanVideo", argv)


if __name__ == "__main__":
    main()
