"""Write a complete diffusers-layout Wan folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_wan OUT_DIR [--seed N] [--variant t2v|ti2v|a14b|i2v|i2v_a14b]

Same structure and config keys as Wan-AI/Wan2.1-T2V-1.3B-Diffusers (``t2v``),
Wan-AI/Wan2.2-TI2V-5B-Diffusers (``ti2v``), Wan-AI/Wan2.2-T2V-A14B-Diffusers (``a14b``: two experts,
transformer/ for the high-noise steps and transformer_2/ for the low-noise ones, with the published
model_index.json's ``boundary_ratio`` 0.875) or Wan-AI/Wan2.1-I2V-14B-480P-Diffusers (``i2v``:
WanImageToVideoPipeline; the transformer takes 16 + 4 + 16 = 36 channels, the noisy latents, the
first-frame mask and the first frame's latents, and the CLIP image features through its image
embedder (``image_dim``) and the blocks' added key/value projections (``added_kv_proj_dim``); a
CLIPVisionModel image_encoder/ and a CLIPImageProcessor image_processor/) or
Wan-AI/Wan2.2-I2V-A14B-Diffusers (``i2v_a14b``: WanImageToVideoPipeline with two 36-channel experts
and boundary_ratio 0.9, no image encoder), scaled down: WanTransformer3DModel (self- and cross-
attention blocks with q/k RMS norms across heads, 3-axis RoPE over frames x rows x columns, 1x2x2
patches), AutoencoderKLWan (the causal 3D video VAE: 4x in time, 8x in space with 16 latent channels
and Wan2.1's per-channel latents_mean / latents_std; for ti2v Wan2.2's residual VAE with its 2x2 pixel
patches, 16x in space, 48 latent channels and Wan2.2's statistics), a UMT5EncoderModel with the tiny
T5-style Unigram tokenizer of make_tiny_flux (nothing from the hub), and the scheduler the real
folders ship: UniPCMultistepScheduler with flow sigmas (flow_shift 3.0 for Wan2.1, 5.0 for Wan2.2
TI2V; diffusers' scripts/convert_wan_to_diffusers.py). The ti2v folder's model_index.json carries
WanPipeline's ``expand_timesteps: true`` (per-token timesteps) and ``boundary_ratio: null``, as the
published Wan2.2-TI2V-5B folder. WanPipeline loads each folder; the same seed gives the same
weights, bit for bit. Needs the current library line (diffusers 0.32 has no Wan).
"""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo.errors import UserError
from fastvideo.tools.make_tiny_flux import write_t5_tokenizer
from fastvideo.tools.tiny_builder import new_folder, run_builder_cli, save_tiny_folder, wake_zero_projections

VARIANTS = ("t2v", "ti2v", "a14b", "i2v", "i2v_a14b")
# The real folders' scheduler (convert_wan_to_diffusers.py: flow_prediction, use_flow_sigmas, 1000
# training steps, flow_shift 3.0 for Wan2.1 T2V and Wan2.2-T2V-A14B, 5.0 for Wan2.2 TI2V); the rest
# UniPC's defaults.
FLOW_SHIFT = {"t2v": 3.0, "ti2v": 5.0, "a14b": 3.0, "i2v": 3.0, "i2v_a14b": 5.0}
# Wan2.2-I2V-A14B: the Wan2.2 repository's wan/configs/wan_i2v_A14B.py, boundary 0.900 and sample_shift 5.0;
# its transformers take the first frame's condition (36 channels) but no CLIP features (image_dim None).
I2V_A14B_BOUNDARY_RATIO = 0.9
# Wan2.1-I2V's conditioning channels beside the noisy latents: the 4 mask channels (the first frame's
# mask repeated over the VAE's 4 frames a latent frame) and the first frame's 16 latent channels
# (WanImageToVideoPipeline.prepare_latents); its CLIP (ViT-H/14, 1280 wide: the transformer's image_dim).
I2V_MASK_CHANNELS = 4
CLIP_WIDTH, CLIP_SIDE, CLIP_PATCH = 16, 32, 8  # the tiny CLIP vision tower: (32 / 8)^2 + 1 = 17 tokens
# Wan-AI/Wan2.2-T2V-A14B-Diffusers model_index.json: "boundary_ratio": 0.875 (transformer for timesteps
# >= 875, transformer_2 below; the Wan2.2 repository's wan/configs/wan_t2v_A14B.py: boundary 0.875;
# diffusers' scripts/convert_wan_to_diffusers.py writes it for "Wan2.2-T2V-A14B", PR #12004), and
# "expand_timesteps": false (one timestep per sample, as Wan2.1).
A14B_BOUNDARY_RATIO = 0.875
TEXT_WIDTH, HEADS, HEAD_DIM, LAYERS = 32, 2, 16, 2  # umT5's d_model = text_dim (4096 for umt5-xxl)

# Wan2.2's VAE statistics (Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json; 48 channels).
WAN22_LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667]
WAN22_LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]


def scheduler_config(variant: str) -> dict:
    return {
        "_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.42.1",
        "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
        "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": FLOW_SHIFT[variant],
        "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True,
        "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False, "sample_max_value": 1.0,
        "solver_order": 2, "solver_p": None, "solver_type": "bh2", "steps_offset": 0, "thresholding": False,
        "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
        "use_exponential_sigmas": False, "use_flow_sigmas": True, "use_karras_sigmas": False,
    }


def latent_channels(variant: str) -> int:
    return 48 if variant == "ti2v" else 16


def transformer_config(variant: str) -> dict:
    """WanTransformer3DModel at width 32 (Wan2.1-1.3B: 12 heads of 128, 30 layers; the 5B: 24 x 128, 30)."""
    c = latent_channels(variant)
    image = {"in_channels": 2 * c + I2V_MASK_CHANNELS, "image_dim": CLIP_WIDTH,
             "added_kv_proj_dim": HEADS * HEAD_DIM} if variant == "i2v" else {}
    if variant == "i2v_a14b":
        image = {"in_channels": 2 * c + I2V_MASK_CHANNELS}
    return {
        "_class_name": "WanTransformer3DModel", "_diffusers_version": "0.42.1",
        "patch_size": [1, 2, 2], "num_attention_heads": HEADS, "attention_head_dim": HEAD_DIM,
        "in_channels": c, "out_channels": c, "text_dim": TEXT_WIDTH, "freq_dim": 32, "ffn_dim": 64,
        "num_layers": LAYERS, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
        "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024, "pos_embed_seq_len": None,
        **image,
    }


def vae_config(variant: str) -> dict:
    """AutoencoderKLWan 8 wide: three spatial down-samplings, the last two temporal (4x in time).
    ti2v: Wan2.2's residual VAE (12 = 3 x 2 x 2 patched pixel channels, 16x in space, 48 latents)."""
    common = {"_class_name": "AutoencoderKLWan", "_diffusers_version": "0.42.1", "base_dim": 8,
              "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1, "attn_scales": [],
              "temperal_downsample": [False, True, True], "dropout": 0.0, "scale_factor_temporal": 4}
    if variant == "ti2v":
        return {**common, "decoder_base_dim": 8, "z_dim": 48, "is_residual": True, "in_channels": 12,
                "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
                "latents_mean": WAN22_LATENTS_MEAN, "latents_std": WAN22_LATENTS_STD}
    from fastvideo.tools.make_tiny_qwen_image import vae_config as wan21_statistics  # Wan2.1's VAE statistics

    stats = wan21_statistics()
    return {**common, "decoder_base_dim": None, "z_dim": 16, "is_residual": False, "in_channels": 3,
            "out_channels": 3, "patch_size": None, "scale_factor_spatial": 8,
            "latents_mean": stats["latents_mean"], "latents_std": stats["latents_std"]}


def tiny_umt5(vocab: int):
    """A UMT5EncoderModel for write_t5_tokenizer's vocabulary (pad 0, EOS 1), 32 wide."""
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(
        vocab_size=vocab, d_model=TEXT_WIDTH, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1,
        tie_word_embeddings=False))


def tiny_clip_vision():
    """A CLIPVisionModel 16 wide, 2 layers, 32-pixel images in 8-pixel patches (the real one: ViT-H/14
    at 224, 1280 wide, 32 layers; the pipeline reads the second-last hidden state)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    return CLIPVisionModel(CLIPVisionConfig(hidden_size=CLIP_WIDTH, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, image_size=CLIP_SIDE, patch_size=CLIP_PATCH,
                                            projection_dim=CLIP_WIDTH))


def write_clip_processor(folder: Path) -> None:
    """CLIPImageProcessor as the published image_processor/ (OpenAI CLIP's mean and std, bicubic
    resize of the short side, centre crop), at the tiny tower's 32 pixels."""
    from transformers import CLIPImageProcessor

    CLIPImageProcessor(size={"shortest_edge": CLIP_SIDE}, crop_size={"height": CLIP_SIDE, "width": CLIP_SIDE},
                       image_mean=[0.48145466, 0.4578275, 0.40821073],
                       image_std=[0.26862954, 0.26130258, 0.27577711]).save_pretrained(folder)


def build_modules(variant: str, vocab: int, seed: int):
    """Every network of the folder, weights drawn from ``seed`` (a14b: the low-noise expert drawn
    last, from the same stream, so that the two experts differ)."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel.from_config(transformer_config(variant))
    vae = AutoencoderKLWan.from_config(vae_config(variant))
    text_encoder = tiny_umt5(vocab)
    wake_zero_projections(transformer, seed + 1)
    if variant == "i2v":
        return transformer, vae, text_encoder, tiny_clip_vision()
    if variant not in ("a14b", "i2v_a14b"):
        return transformer, vae, text_encoder
    transformer_2 = WanTransformer3DModel.from_config(transformer_config(variant))
    wake_zero_projections(transformer_2, seed + 2)
    return transformer, vae, text_encoder, transformer_2


def make_tiny_wan(out_dir: str | Path, seed: int = 0, variant: str = "t2v") -> Path:
    if variant not in VARIANTS:
        raise UserError(f"--variant {variant!r}: choose t2v (Wan2.1-T2V), ti2v (Wan2.2-TI2V-5B), a14b "
                        "(Wan2.2-T2V-A14B), i2v (Wan2.1-I2V) or i2v_a14b (Wan2.2-I2V-A14B)")
    out = new_folder(out_dir, "the tiny Wan builder")
    vocab = write_t5_tokenizer(out / "tokenizer")
    names = ("transformer", "vae", "text_encoder", "image_encoder" if variant == "i2v" else "transformer_2")
    modules = dict(zip(names, build_modules(variant, vocab, seed)))
    extra = {"ti2v": {"boundary_ratio": None, "expand_timesteps": True, "transformer_2": [None, None]},
             "a14b": {"boundary_ratio": A14B_BOUNDARY_RATIO, "expand_timesteps": False},
             "i2v": {"boundary_ratio": None, "expand_timesteps": False, "transformer_2": [None, None]},
             "i2v_a14b": {"boundary_ratio": I2V_A14B_BOUNDARY_RATIO, "expand_timesteps": False,
                          "image_encoder": [None, None], "image_processor": [None, None]}}.get(variant, {})
    named = {"tokenizer": "T5TokenizerFast"}
    if variant == "i2v":
        write_clip_processor(out / "image_processor")
        named["image_processor"] = "CLIPImageProcessor"
    pipeline = "WanImageToVideoPipeline" if variant.startswith("i2v") else "WanPipeline"
    return save_tiny_folder(out, modules, scheduler_config(variant), pipeline, named, **extra)


def make_tiny_wan_i2v(out_dir: str | Path, seed: int = 0) -> Path:
    """The tiny Wan2.1-I2V folder (``--variant i2v``): the wan_i2v family's tiny builder."""
    return make_tiny_wan(out_dir, seed, "i2v")


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_wan", __doc__, lambda a: make_tiny_wan(a.out_dir, a.seed, a.variant),
                    lambda a: f"tiny Wan {a.variant}", argv,
                    options=((("--variant",), dict(choices=VARIANTS, default="t2v",
                                                   help="t2v: Wan2.1-T2V; ti2v: Wan2.2-TI2V-5B; a14b: "
                                                        "Wan2.2-T2V-A14B's two experts; i2v: Wan2.1-I2V "
                                                        "(WanImageToVideoPipeline); i2v_a14b: Wan2.2-I2V-A14B "
                                                        "(two experts, no image encoder; default: t2v)")),))


if __name__ == "__main__":
    main()
