"""HunyuanVideo (text to video, 13B, guidance-distilled) as a ModelFamily (--model_family hunyuan_video),
on both library lines (HunyuanVideoPipeline is in diffusers 0.32 and 0.42): Llama hidden states with
their mask and CLIP's pooled embedding, the causal 3D VAE (16 channels, 4x in time, 8x in space,
scaling_factor 0.476986), a dual- then single-stream DiT over 1x2x2 patches with 3-axis RoPE, and the
embedded guidance (1000 x --guidance_scale, default the pipeline's 6.0; no classifier-free guidance).

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, L, D], "prompt_mask" [B, L] and
"pooled" [B, P]. Stored per prompt under DanceGRPO's folders and keys (prompt_embed/,
prompt_attention_mask/; preprocess_hunyuan_embeddings.py at 15cc71d) and pooled_prompt_embeds/ (DanceGRPO's
HunyuanVideo text encoder packs CLIP's pooled vector into the sequence's first row instead; here it is
its own tensor, as the pipeline passes it). Latents: tokens [B, f h w, 16], one per latent cell. Layout
extras: "grid" (f, h, w), "latent_h", "latent_w", "num_frames". Decoding gives frames [B, F, 3, H, W]
in [0, 1].
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

import fastvideo.models.hunyuan_video.components as C
import fastvideo.models.hunyuan_video.flops as F
import fastvideo.models.hunyuan_video.reference as R
from fastvideo.models import base, record_checks
from fastvideo.models.base import EmbeddingShapeError, LatentLayout, StoredTensor, TensorConditioning
from fastvideo.models.diffusers_family import ComponentFunctions, DiffusersFamily, video_layout
from fastvideo.models.hunyuan_video.settings import HunyuanVideoSettings
from fastvideo.models.latents import latent_hw
from fastvideo.models.video_decode import measured_decode_flops

MODEL_HINT = ("the embeddings were made with other text encoders (HunyuanVideo: Llama 4096 wide, CLIP-L 768) — "
              "re-run preprocessing with --model_path pointing at this model")


class HunyuanVideoFamily(DiffusersFamily):
    """HunyuanVideo text to video. guidance_scale: the embedded guidance (None: the pipeline's 6.0);
    quantize_timestep: floor(1000 sigma) timesteps (DanceGRPO's); settings / num_frames: the clip's
    frames (4k + 1; default the pipeline's 129)."""

    name = "hunyuan_video"
    export_class_name = "HunyuanVideoTransformer3DModel"
    pipeline_class_name = "HunyuanVideoPipeline"
    settings = HunyuanVideoSettings
    storage = (StoredTensor("prompt_embeds", "prompt_embed_path", "prompt_embed"),
               StoredTensor("prompt_mask", "prompt_attention_mask", "prompt_attention_mask"),
               StoredTensor("pooled", "pooled_prompt_embeds_path", "pooled_prompt_embeds"))
    json_keys = base.json_keys_of(storage)
    max_sequence_length_limit = 256  # the pipeline's max_sequence_length (the model was trained with 256)
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    text_encoder_components = ("text_encoder", "text_encoder_2")
    training_components = ("transformer", "vae", "text_encoder", "text_encoder_2")
    parts = ComponentFunctions(
        check_folder=C.check_folder, folder_error=C.HunyuanVideoFolderError, load_transformer=C.load_transformer,
        adapt_for_device=C.adapt_for_device, load_vae=C.load_vae, load_text_encoders=C.load_text_encoders,
        encode_prompts=C.encode_prompts, decode_latents=C.decode_latents,
        flops_breakdown=F.transformer_flops_breakdown, backward_flops=F.transformer_backward_flops)
    block_flop_parts = ("dual_blocks", "single_blocks")
    reference_config, reference_vae_config, reference_name = R.TRANSFORMER, R.VAE, R.NAME
    default_guidance_scale = C.DEFAULT_GUIDANCE
    block_lists = ("transformer_blocks", "single_transformer_blocks")
    token_patch = 1  # one latent cell per rollout token; the transformer patches 1x2x2 itself
    video_fps = C.VIDEO_FPS

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False,
                 settings: HunyuanVideoSettings | None = None, num_frames: int | None = None):
        super().__init__(guidance_scale, quantize_timestep)
        frames = num_frames if num_frames is not None else (settings or HunyuanVideoSettings()).num_frames
        self.num_frames = C.check_frames(int(frames))

    def set_num_frames(self, frames: int) -> None:
        """The clip length (4k + 1; else ConfigError in one line): the cost model's --num_frames."""
        from fastvideo.errors import ConfigError

        self.num_frames = C.check_frames(int(frames), ConfigError)

    def block_classes(self):
        from diffusers.models.transformers.transformer_hunyuan_video import (
            HunyuanVideoSingleTransformerBlock, HunyuanVideoTransformerBlock)

        return (HunyuanVideoTransformerBlock, HunyuanVideoSingleTransformerBlock)

    def sequence_parallel_plan(self):
        """The video tokens split after the patch embedding, gathered after the output projection; the
        dual- and single-stream attention across the sequence group, the text replicated
        (models/hunyuan_video/sequence_parallel.py)."""
        from fastvideo.models.hunyuan_video.sequence_parallel import hunyuan_video_plan

        return hunyuan_video_plan()

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=C.MAX_SEQUENCE_LENGTH) -> TensorConditioning:
        embeds, mask, pooled = C.encode_prompts(encoders, list(prompts), max_sequence_length)
        return TensorConditioning({"prompt_embeds": embeds, "prompt_mask": mask, "pooled": pooled})

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        return TensorConditioning({k: torch.stack([r[k] for r in records]) for k in ("prompt_embeds", "prompt_mask",
                                                                                   "pooled")})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D, P)); the mask [L]; first_dims: prompt 0's, to refuse a mix."""
        embed, mask, pooled = record["prompt_embeds"], record["prompt_mask"], record["pooled"]
        if embed.ndim != 2 or tuple(mask.shape) != embed.shape[:1] or pooled.ndim != 1:
            raise EmbeddingShapeError(
                f"prompt {idx}: prompt_embed {tuple(embed.shape)}, prompt_attention_mask {tuple(mask.shape)} and "
                f"pooled {tuple(pooled.shape)} should be [L, D], [L] and [P] (one prompt per file); re-run the "
                "preprocessing")
        dims = (embed.shape[0], embed.shape[1], pooled.shape[0])
        record_checks.check_first_dims(idx, dims, first_dims, where)
        return dict(record), dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        seq, width, pooled = dims
        record_checks.check_width("prompt embeddings", width, transformer_config, "text_embed_dim", MODEL_HINT)
        record_checks.check_width("pooled prompt embeddings", pooled, transformer_config, "pooled_projection_dim", MODEL_HINT)
        record_checks.check_sequence_length(seq, max_sequence_length)

    def encoder_dims(self, encoders) -> dict[str, int]:
        return {"embed_dim": encoders.hidden_size, "pooled_dim": encoders.pooled_size}

    def record_shapes(self, max_sequence_length, encoder_dims):
        return ((max_sequence_length, encoder_dims["embed_dim"]), (max_sequence_length,),
                (encoder_dims["pooled_dim"],))

    def check_cond(self, cond) -> None:
        embeds, mask, pooled = cond["prompt_embeds"], cond["prompt_mask"], cond["pooled"]
        if embeds.ndim != 3 or mask.shape != embeds.shape[:2] or pooled.ndim != 2:
            raise ValueError(f"prompt_embeds must be [P, L, D] with prompt_mask [P, L] and pooled [P, P'], got "
                             f"{tuple(embeds.shape)}, {tuple(mask.shape)} and {tuple(pooled.shape)}")

    # -- sampling
    def vae_geometry(self, vae_config) -> tuple[int, int]:
        """AutoencoderKLHunyuanVideo's: spatial_compression_ratio pixels per cell, latent_channels."""
        return int(base.config_value(vae_config, "spatial_compression_ratio")), \
            int(base.config_value(vae_config, "latent_channels"))

    def nominal_layout(self, height, width, transformer_config) -> LatentLayout:
        return self._layout(height, width, *latent_hw(height, width, 8), transformer_config["in_channels"])

    def _layout(self, height, width, latent_h, latent_w, channels, device=None) -> LatentLayout:
        return video_layout(height, width, latent_h, latent_w, channels, C.latent_frames(self.num_frames),
                            self.num_frames)

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["prompt_mask"], cond["pooled"],
                                  layout["grid"], self.scale, self.quantize_timestep)

    def decode(self, vae, x0, layout) -> torch.Tensor:
        """Frames [B, F, 3, H, W] float32 in [0, 1]."""
        return C.decode_latents(vae, x0, layout["grid"])

    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The transformer's video tokens of one clip: latent frames x rows x columns after its 1x2x2 patches."""
        f, h, w = self.nominal_layout(height, width, transformer_config)["grid"]
        p, p_t = transformer_config["patch_size"], transformer_config.get("patch_size_t", 1)
        return (f // p_t) * (h // p) * (w // p)

    # -- cost model (text_tokens: the Llama sequence length)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        """The memory model's forward on the meta device: the current library line only (diffusers 0.32's
        transformer fills its attention mask row by row from the mask's values, which meta tensors lack)."""
        from fastvideo.library_lines import CURRENT, require_line

        require_line(CURRENT, "the memory model of HunyuanVideo (a meta-device forward)")
        m = "meta"
        return dict(hidden_states=torch.empty(batch, config["in_channels"], *layout["grid"], device=m, dtype=dtype),
                    timestep=torch.empty(batch, device=m, dtype=dtype),
                    encoder_hidden_states=torch.empty(batch, text_tokens, config["text_embed_dim"], device=m,
                                                      dtype=dtype),
                    encoder_attention_mask=torch.ones(batch, text_tokens, device=m, dtype=dtype),
                    pooled_projections=torch.empty(batch, config["pooled_projection_dim"], device=m, dtype=dtype),
                    guidance=torch.empty(batch, device=m, dtype=dtype), return_dict=False)

    def cond_numel(self, config, text_tokens) -> int:
        return text_tokens * (config["text_embed_dim"] + 1) + config["pooled_projection_dim"]

    def vae_decode_flops(self, vae_config, transformer_config, height, width) -> int:
        """One clip's decode, counted on the meta device (models/video_decode.py)."""
        return measured_decode_flops(self, vae_config, transformer_config, height, width)

    def meta_vae(self, vae_config, batch, layout, dtype):
        """(the causal AutoencoderKLHunyuanVideo, ``batch`` clips' latents [B, C, f, h, w]) on the meta device."""
        from diffusers import AutoencoderKLHunyuanVideo

        with torch.device("meta"):
            vae = AutoencoderKLHunyuanVideo.from_config({k: v for k, v in vae_config.items() if not k.startswith("_")})
        return vae.to(dtype), torch.empty(batch, vae_config["latent_channels"], *layout["grid"], device="meta",
                                          dtype=dtype)
