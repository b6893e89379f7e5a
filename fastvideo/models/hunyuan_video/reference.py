"""The published HunyuanVideo transformer's and VAE's configs (hunyuanvideo-community/HunyuanVideo's
transformer/config.json and vae/config.json, the keys the cost model reads): the cost model's default
for --model_family hunyuan_video (python -m fastvideo.tools.cost_model --memory --model_family
hunyuan_video --num_frames 53 --h 480 --w 480).

The transformer: 20 dual-stream and 40 single-stream blocks 3072 wide (24 heads of 128), MLP ratio 4, 2
token-refiner blocks, 1x2x2 patches of 16 latent channels, the guidance embedding, Llama's 4096-wide
states and CLIP-L's 768-wide pooled vector; diffusers' HunyuanVideoTransformer3DModel defaults are these
values. The VAE: AutoencoderKLHunyuanVideo's defaults (128, 256, 512, 512 wide, 2 layers a block, 16
latent channels, 4x in time, 8x in space, scaling 0.476986)."""

from __future__ import annotations

TRANSFORMER = {
    "_class_name": "HunyuanVideoTransformer3DModel", "in_channels": 16, "out_channels": 16,
    "num_attention_heads": 24, "attention_head_dim": 128, "num_layers": 20, "num_single_layers": 40,
    "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 2, "patch_size_t": 1, "qk_norm": "rms_norm",
    "guidance_embeds": True, "text_embed_dim": 4096, "pooled_projection_dim": 768, "rope_theta": 256.0,
    "rope_axes_dim": [16, 56, 56],
}
VAE = {
    "_class_name": "AutoencoderKLHunyuanVideo", "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "down_block_types": ["HunyuanVideoDownBlock3D"] * 4, "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
    "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu", "norm_num_groups": 32,
    "scaling_factor": 0.476986, "spatial_compression_ratio": 8, "temporal_compression_ratio": 4,
    "mid_block_add_attention": True,
}
NAME = "HunyuanVideo (13B)"
