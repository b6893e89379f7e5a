"""Write a complete diffusers-layout FLUX.2 [klein] or [dev] folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_flux2 OUT_DIR [--seed N] [--distilled] [--variant klein|dev]

Same structure and config keys as black-forest-labs/FLUX.2-klein-base-4B, scaled down:
Flux2TransformerModel with double- and single-stream blocks (no guidance embedding, 4-axis RoPE,
SwiGLU MLPs of ratio 3), AutoencoderKLFlux2 with 32 latent channels, 2x2 patches and batch-norm
latent statistics (random running mean / variance here, so that a decode that skips them is
wrong), a 36-layer Qwen3ForCausalLM text encoder (the pipeline reads its layers 9, 18 and 27) with
a byte-level BPE tokenizer and a Qwen3-style chat template written here (no hub), and the
flow-matching scheduler with dynamic shifting. ``--distilled`` writes ``is_distilled: true`` into
model_index.json (a step-distilled klein: no classifier-free guidance). Flux2KleinPipeline loads
the folder; the same seed gives the same weights, bit for bit. Needs the current library line.

``--variant dev`` writes a tiny FLUX.2 [dev] instead (black-forest-labs/FLUX.2-dev's structure): the
same transformer blocks with a guidance embedding (guidance-distilled), the same VAE, and a tiny
Mistral-3 text encoder (Mistral3ForConditionalGeneration, 40 decoder layers: the pipeline reads 10,
20 and 30) behind a PixtralProcessor (fastvideo/tools/tiny_mistral3.py); Flux2Pipeline loads it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux import FLUX_SCHEDULER_CONFIG
from fastvideo.tools.tiny_builder import bytes_to_unicode, new_folder, run_builder_cli, save_tiny_folder
from fastvideo.tools.tiny_builder import wake_zero_projections

# FLUX.2 [klein]'s scheduler: FLUX.1's with exponential dynamic shifting (the pipeline computes mu
# itself from the image's token count and the step count); its keys sorted, as in the published file.
FLUX2_SCHEDULER_CONFIG = dict(sorted({**FLUX_SCHEDULER_CONFIG, "_diffusers_version": "0.42.1",
                                      "time_shift_type": "exponential"}.items()))
QWEN_WIDTH, QWEN_LAYERS = 16, 36  # Qwen3-4B / -8B have 36 layers; the pipeline reads 9, 18, 27
HEADS, HEAD_DIM, DOUBLE, SINGLE = 2, 16, 2, 2  # transformer width 32, as the tiny FLUX.1 / SD3.5
# The tiny VAE's batch-norm running variance: decode multiplies the latents by sqrt(var) = 2.2 .. 3.2,
# about what FLUX.1's z / 0.3611 (x 2.77) does, which the tiny SD3.5 needed for its demo to learn
# (docs/sd3.md, Demo). Adam on the decoded images' total variation through the 8-step sampler (exact
# gradients, 25 steps) lowers it by 71 % with these statistics and by 52 % with variance 1 (docs/flux2.md).
TINY_BN_VAR = (5.0, 10.0)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]  # Qwen3's thinking markers: added tokens, not special ones
# Qwen3's chat template for what the pipeline sends (user turns, the generation prompt, thinking
# switched off by an empty thought), written out here.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def word_merges(words, byte_map: dict[int, str]) -> list[tuple[str, str]]:
    """Left-to-right BPE merges that make each of ``words`` (a leading space included) one token."""
    merges: list[tuple[str, str]] = []
    for word in words:
        chars = [byte_map[b] for b in word.encode("utf-8")]
        for k in range(1, len(chars)):
            pair = ("".join(chars[:k]), chars[k])
            if pair not in merges:
                merges.append(pair)
    return merges


def write_qwen_tokenizer(out: Path, words=()) -> int:
    """A byte-level BPE tokenizer in Qwen2's class (one token per byte, merges for the letter pairs
    of English words and a space before a letter, so a prompt takes about half its characters in
    tokens), with Qwen3's special tokens, pad token and chat template. ``words``: whole words made
    single tokens first (their merges take precedence). Returns its size."""
    from transformers import Qwen2TokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    symbols = list(bytes_to_unicode().values())
    space = bytes_to_unicode()[ord(" ")]
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = word_merges(words, bytes_to_unicode())
    merges += [m for m in [(space, c) for c in letters] + [(a, b) for a in letters for b in letters] if m not in merges]
    vocab = {t: i for i, t in enumerate(symbols + ["".join(m) for m in merges])}
    tok = Qwen2TokenizerFast(vocab=vocab, merges=merges, unk_token=None,
                             pad_token="<|endoftext|>", eos_token="<|im_end|>", model_max_length=32768)
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.add_tokens(THINK)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return len(tok)


def qwen3(vocab: int, layers: int = QWEN_LAYERS):
    """Qwen3ForCausalLM at width 16 (Qwen3-4B's 36 layers by default), grouped-query attention, tied embeddings."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=vocab, hidden_size=QWEN_WIDTH, intermediate_size=2 * QWEN_WIDTH, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096,
        tie_word_embeddings=True, use_cache=False, rope_theta=1000000.0))


def transformer_config(dev: bool = False) -> dict:
    """klein's blocks; dev: its guidance embedding and the Mistral-3 text width (3 x 16)."""
    from fastvideo.tools.tiny_mistral3 import MISTRAL_WIDTH

    return {
        "_class_name": "Flux2Transformer2DModel",
        "_diffusers_version": "0.42.1",
        "patch_size": 1,
        "in_channels": 128,
        "out_channels": None,
        "num_layers": DOUBLE,
        "num_single_layers": SINGLE,
        "attention_head_dim": HEAD_DIM,
        "num_attention_heads": HEADS,
        "joint_attention_dim": 3 * (MISTRAL_WIDTH if dev else QWEN_WIDTH),
        "timestep_guidance_channels": 256,
        "mlp_ratio": 3.0,
        "axes_dims_rope": [4, 4, 4, 4],
        "rope_theta": 2000,
        "eps": 1e-6,
        "guidance_embeds": dev,
    }


def vae_config() -> dict:
    return {
        "_class_name": "AutoencoderKLFlux2",
        "_diffusers_version": "0.42.1",
        "act_fn": "silu",
        "block_out_channels": [8, 8, 8, 8],
        "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 32,
        "layers_per_block": 1,
        "mid_block_add_attention": True,
        "norm_num_groups": 4,
        "sample_size": 1024,
        "use_quant_conv": True,
        "use_post_quant_conv": True,
        "batch_norm_eps": 1e-4,
        "batch_norm_momentum": 0.1,
        "patch_size": [2, 2],
    }


def build_modules(vocab: int, seed: int, dev: bool = False):
    """Every network of the folder, weights (and the VAE's latent statistics) drawn from ``seed``."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

    from fastvideo.tools.tiny_mistral3 import mistral3

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel.from_config(transformer_config(dev))
    vae = AutoencoderKLFlux2.from_config(vae_config())
    with torch.no_grad():  # a trained VAE's statistics are not 0 / 1: make skipping them visible
        vae.bn.running_mean.normal_(0.0, 0.2)
        vae.bn.running_var.uniform_(*TINY_BN_VAR)
    text_encoder = mistral3(vocab) if dev else qwen3(vocab)
    wake_zero_projections(transformer, seed + 1)
    return transformer, vae, text_encoder


# The tokenizer entries of FLUX.2 [klein]'s model_index.json and of black-forest-labs/FLUX.2-dev's
# (Mistral-3 behind a PixtralProcessor; no is_distilled: guidance-distilled, the scale goes into the
# guidance embedding).
KLEIN_TOKENIZER = {"tokenizer": "Qwen2TokenizerFast"}
DEV_TOKENIZER = {"tokenizer": "PixtralProcessor"}
VARIANTS = ("klein", "dev")


def make_tiny_flux2(out_dir: str | Path, seed: int = 0, distilled: bool = False, variant: str = "klein") -> Path:
    from fastvideo.errors import ConfigError
    from fastvideo.library_lines import CURRENT, require_line

    require_line(CURRENT, "the tiny FLUX.2 builder")
    if variant not in VARIANTS or (distilled and variant == "dev"):
        raise ConfigError(f"--variant {variant!r}{' with --distilled' if distilled else ''} is not a "
                          "FLUX.2 checkpoint kind: use --variant klein [--distilled] or --variant dev (guidance-"
                          "distilled already: no --distilled)")
    dev = variant == "dev"
    out = new_folder(out_dir)
    if dev:
        from fastvideo.tools.tiny_mistral3 import write_mistral3_processor

        vocab = write_mistral3_processor(out / "tokenizer")
    else:
        vocab = write_qwen_tokenizer(out / "tokenizer")
    modules = dict(zip(("transformer", "vae", "text_encoder"), build_modules(vocab, seed, dev)))
    if dev:
        return save_tiny_folder(out, modules, FLUX2_SCHEDULER_CONFIG, "Flux2Pipeline", DEV_TOKENIZER)
    return save_tiny_folder(out, modules, FLUX2_SCHEDULER_CONFIG, "Flux2KleinPipeline", KLEIN_TOKENIZER,
                            is_distilled=distilled)


def main(argv: list[str] | None = None) -> None:
    options = ((("--distilled",), dict(action="store_true", help="mark the folder step-distilled (no guidance)")),
               (("--variant",), dict(default="klein", help="klein (Qwen3, Flux2KleinPipeline) or dev (Mistral-3, "
                                     "guidance embedding, Flux2Pipeline)")))
    run_builder_cli("make_tiny_flux2", __doc__,
                    lambda a: make_tiny_flux2(a.out_dir, a.seed, a.distilled, a.variant),
                    lambda a: f"tiny FLUX.2 [{a.variant}]", argv, options,
                    note=lambda a: ", distilled" if a.distilled else "")


if __name__ == "__main__":
    main()
