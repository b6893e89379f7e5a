"""The published Wan transformers' and VAEs' configs (the diffusers folders' transformer/config.json and
vae/config.json, the keys the cost model reads): the cost model's `--model` names for --model_family wan
(python -m fastvideo.tools.cost_model --memory --model_family wan --model wan2.2-ti2v-5b --num_frames 81).

Wan-AI/Wan2.1-T2V-1.3B-Diffusers: 30 blocks 1536 wide (12 heads of 128), FFN 8960; -14B-Diffusers: 40 blocks
5120 wide (40 heads), FFN 13824; Wan2.2-TI2V-5B-Diffusers: 30 blocks 3072 wide (24 heads), FFN 14336, 48 latent
channels; Wan2.2-T2V-A14B-Diffusers: two experts, transformer/ and transformer_2/, each the 14B's config (40 blocks
5120 wide, FFN 13824, 16 channels: the folders' config.json files, diffusers 0.35.0.dev0), model_index.json's
boundary_ratio 0.875, Wan2.1's VAE (the cost model's entry says "two_experts": the boundary ratio). The VAEs:
Wan2.1's AutoencoderKLWan (diffusers' defaults: 16 channels, 8 pixels per cell) and Wan2.2's (48 channels, 16 pixels per cell: base 160, decoder base 256, residual, patch 2)."""

from __future__ import annotations

_COMMON = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "attention_head_dim": 128,
           "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
           "eps": 1e-6, "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024}


def _transformer(heads: int, ffn: int, layers: int, channels: int) -> dict:
    return {**_COMMON, "num_attention_heads": heads, "ffn_dim": ffn, "num_layers": layers,
            "in_channels": channels, "out_channels": channels}


WAN21_VAE = {"_class_name": "AutoencoderKLWan", "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
             "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
             "scale_factor_spatial": 8, "scale_factor_temporal": 4}
WAN22_VAE = {**WAN21_VAE, "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "is_residual": True,
             "in_channels": 12, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
             "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48}

# --model name -> (transformer config, VAE config, what the report prints)
MODELS = {
    "wan2.1-t2v-1.3b": (_transformer(12, 8960, 30, 16), WAN21_VAE, "Wan2.1-T2V-1.3B"),
    "wan2.2-ti2v-5b": (_transformer(24, 14336, 30, 48), WAN22_VAE, "Wan2.2-TI2V-5B"),
    "wan2.1-t2v-14b": (_transformer(40, 13824, 40, 16), WAN21_VAE, "Wan2.1-T2V-14B"),
    "wan2.2-t2v-a14b": ({**_transformer(40, 13824, 40, 16), "two_experts": 0.875}, WAN21_VAE,
                        "Wan2.2-T2V-A14B (two 14B experts)"),
}

# Image to video (--model_family wan_i2v's --model names): the transformer configs of diffusers'
# scripts/convert_wan_to_diffusers.py (github.com/huggingface/diffusers at 7d56827, get_transformer_config:
# "Wan-I2V-14B-480p", "Wan-I2V-14B-720p", "Wan2.2-I2V-14B-720p"), the config.json files of
# Wan-AI/Wan2.1-I2V-14B-480P-Diffusers, -720P-Diffusers and Wan2.2-I2V-A14B-Diffusers: the 14B's 40 blocks 5120
# wide, FFN 13824, 36 input channels (16 latents + the first frame's 4 mask and 16 latent channels), 16 out;
# Wan2.1-I2V's CLIP image tokens through image_dim 1280 (ViT-H/14's width) and added_kv_proj_dim 5120, none for
# Wan2.2-I2V-A14B, whose model_index.json has boundary_ratio 0.9 (the Wan2.2 repository's
# wan/configs/wan_i2v_A14B.py: boundary 0.900) and two experts. 480P and 720P differ in their weights only.
_I2V14B = {**_transformer(40, 13824, 40, 16), "in_channels": 36}
_CLIP = {"image_dim": 1280, "added_kv_proj_dim": 5120}
I2V_MODELS = {
    "wan2.1-i2v-14b-480p": ({**_I2V14B, **_CLIP}, WAN21_VAE, "Wan2.1-I2V-14B-480P"),
    "wan2.1-i2v-14b-720p": ({**_I2V14B, **_CLIP}, WAN21_VAE, "Wan2.1-I2V-14B-720P"),
    "wan2.2-i2v-a14b": ({**_I2V14B, "two_experts": 0.9}, WAN21_VAE, "Wan2.2-I2V-A14B (two 14B experts)"),
    # one folder for text- and image-to-video (expand_timesteps: the given first frame replaces latents, no
    # extra channels or image tokens), so the same transformer as the text-to-video entry
    "wan2.2-ti2v-5b": MODELS["wan2.2-ti2v-5b"],
}
