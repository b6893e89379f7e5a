"""Wan2.1-T2V (1.3B, 14B) and Wan2.2-TI2V-5B as a ModelFamily (--model_family wan, the current library
line only: diffusers 0.32 has no Wan): umT5 text embeddings, the causal 3D video VAE with per-channel
latent statistics (Wan2.1's 16 channels at 8x; Wan2.2's 48 at 16x), a DiT over 1x2x2 patches of the
latent video with 3-axis RoPE, and the pipeline's classifier-free guidance (on for a scale > 1, default
5.0, with the negative prompt's embeddings; WanPipeline's default negative prompt is "").

The variant is the folder's: model_index.json's ``expand_timesteps`` (Wan2.2-TI2V-5B: true) gives
the transformer a timestep per latent token, as WanPipeline does; the VAE's config gives the latent
channels and cells. Frames: --num_frames (4k + 1; WanSettings, section "wan"), k + 1 latent frames.

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, L, D] and shared
"neg_prompt_embeds" [L, D] (unmasked: zero past each prompt's tokens, as the pipeline passes them).
Stored per prompt: umt5_embed/ and negative_umt5_embed/. Latents: tokens [B, f h w, C], one per
latent cell (models/latents.py to_tokens of [B, C, f, h, w]). Layout extras: "grid" (f, h, w),
"latent_h", "latent_w", "num_frames". Decoding gives frames [B, F, 3, H, W] in [0, 1]; with
--num_frames 1, F = 1.
"""

from __future__ import annotations

from pathlib import Path

import torch

import fastvideo.models.wan.components as C
from fastvideo.models import base
from fastvideo.models.base import LatentLayout, config_value
from fastvideo.models.diffusers_family import ComponentFunctions, TextEmbedsFamily, video_layout
from fastvideo.models.latents import latent_hw
from fastvideo.models.video_decode import measured_decode_flops
from fastvideo.models.wan.experts import WanExperts, folder_experts
from fastvideo.models.wan.reference import MODELS
from fastvideo.models.wan.settings import WanSettings


class WanFamily(TextEmbedsFamily):
    """Wan2.1-T2V and Wan2.2-TI2V-5B (text to video). guidance_scale: WanPipeline's (> 1: CFG on; None:
    its 5.0); quantize_timestep: floor(1000 sigma) timesteps (DanceGRPO's; the pipeline passes 1000 sigma:
    --no_quantize_timestep); settings / num_frames: the clip's frames (4k + 1; default WanPipeline's 81)."""

    name = "wan"
    library_line = "current"  # diffusers >= 0.33 (WanPipeline, AutoencoderKLWan), UMT5EncoderModel
    export_class_name = "WanTransformer3DModel"
    pipeline_class_name = "WanPipeline"
    settings = WanSettings
    storage = base.stored_tensors({"prompt_embeds": "umt5_embed"}, negatives=True)
    json_keys = base.json_keys_of(storage)
    max_sequence_length_limit = 512  # umT5's text length in Wan (WanPipeline's max_sequence_length default)
    parts = ComponentFunctions(
        check_folder=C.check_wan_folder, folder_error=C.WanFolderError, load_transformer=C.load_transformer,
        adapt_for_device=C.adapt_for_device, load_vae=C.load_vae, load_text_encoders=C.load_text_encoder,
        encode_prompts=C.encode_prompts, decode_latents=C.decode_latents)
    default_guidance_scale = C.DEFAULT_GUIDANCE
    cfg_above = 1.0
    block_lists = ("blocks",)
    token_patch = 1  # one latent cell per rollout token; the transformer patches 1x2x2 itself
    masked = False
    negative_prompt = C.NEGATIVE_PROMPT
    text_width_key = "text_dim"
    model_hint = ("the embeddings were made with another text encoder (Wan uses umT5-XXL, 4096 wide) — re-run "
                  "preprocessing with --model_path pointing at this model")
    made_by = "Wan preprocessing (--model_family wan)"
    reference_config, reference_vae_config, reference_name = MODELS["wan2.1-t2v-1.3b"]
    reference_models = MODELS  # the cost model's --model names (models/wan/reference.py)
    video_fps = C.WAN21_FPS  # Wan2.2-TI2V-5B's 24 once its folder was checked or loaded (_note_variant)

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False,
                 settings: WanSettings | None = None, num_frames: int | None = None,
                 guidance_scale_2: float | None = None):
        super().__init__(guidance_scale, quantize_timestep)
        own = settings or WanSettings()
        frames = num_frames if num_frames is not None else own.num_frames
        self.num_frames = C.check_num_frames(int(frames))
        # the low-noise expert's scale (WanPipeline's guidance_scale_2; None: guidance_scale's)
        self.guidance_scale_2 = guidance_scale_2 if guidance_scale_2 is not None else own.guidance_scale_2
        self.train_experts = own.train_experts  # which of a two-expert folder's experts train ("high,low")
        self.expand_timesteps = False  # Wan2.2-TI2V's per-token timesteps, once a folder was checked or loaded
        self.experts = None  # (boundary_ratio, num_train_timesteps) of a two-expert folder (Wan2.2-A14B)

    def set_num_frames(self, frames: int) -> None:
        """The clip length (4k + 1; else ConfigError in one line): the cost model's --num_frames."""
        from fastvideo.errors import ConfigError

        self.num_frames = C.check_num_frames(int(frames), ConfigError)

    def _note_variant(self, root) -> None:
        self.expand_timesteps = C.expand_timesteps(root)
        self.video_fps = C.TI2V_FPS if self.expand_timesteps else C.WAN21_FPS
        self.experts = folder_experts(root)
        if self.experts is None and self.guidance_scale_2 is not None:
            raise C.WanFolderError(f"--guidance_scale_2 {self.guidance_scale_2}: {root} has one transformer (no "
                                   "transformer_2 and boundary_ratio in model_index.json); it is the low-noise "
                                   "expert's scale of a two-expert folder (Wan2.2-A14B): drop the flag")
        if self.experts is None and self.train_experts != "high,low":
            raise C.WanFolderError(f"--train_experts {self.train_experts}: {root} has one transformer (no "
                                   "transformer_2 and boundary_ratio in model_index.json); the choice is a "
                                   "two-expert folder's (Wan2.2-A14B): drop the flag")

    def check_folder(self, path, components=None) -> Path:
        root = super().check_folder(path, components)
        self._note_variant(root)
        if self.experts is not None and (components is None or "transformer" in components):
            C.check_second_expert(root)
        return root

    def load_transformer(self, root, subfolder, device, dtype):
        """The folder's transformer; a two-expert folder's (transformer/ and transformer_2/ with
        boundary_ratio, Wan2.2-A14B) as one WanExperts module."""
        self._note_variant(root)
        model = super().load_transformer(root, subfolder, device, dtype)
        if self.experts is None or subfolder != "transformer":
            return model
        low = C.load_second_expert(root, "transformer_2", device, dtype)
        return WanExperts(model, low, *self.experts)

    def meta_model(self, folder, dtype):
        """A two-expert folder's transformer/ (Wan2.2-A14B): WanExperts of both on meta, the names
        ``transformer_2.*`` read from transformer_2/."""
        root = Path(folder).parent
        self._note_variant(root)
        if self.experts is None or Path(folder).name != "transformer":
            return super().meta_model(folder, dtype)
        high, _ = super().meta_model(folder, dtype)
        low, _ = super().meta_model(root / "transformer_2", dtype)
        return WanExperts(high, low, *self.experts), {"transformer.": Path(folder),
                                                      "transformer_2.": root / "transformer_2"}

    def trained_parts(self, model):
        """A two-expert model's experts that --train_experts names (high: transformer, low: transformer_2)."""
        inner = getattr(model, "module", model)
        if not isinstance(inner, WanExperts):
            return (model,)
        return tuple(e for name, e in zip(("high", "low"), inner.experts()) if name in self.train_experts.split(","))

    def folder_cost_config(self, root, config):
        """A two-expert folder (model_index.json's transformer_2 and boundary_ratio): the config with
        "two_experts" (its boundary ratio), as the cost model's wan2.2-t2v-a14b entry has it, so that
        both experts are counted and --train_experts applies."""
        experts = folder_experts(root)
        return config if experts is None else {**config, "two_experts": experts[0]}

    def meta_transformer(self, config, dtype):
        """The default's meta model with its RoPE tables made for real: WanRotaryPosEmbed keeps them as
        non-persistent buffers, which loading the weights does not fill. A config with "two_experts" (the
        cost model's Wan2.2-A14B entry: its boundary ratio): WanExperts of two such models."""
        if config.get("two_experts") is not None:
            one = {k: v for k, v in config.items() if k != "two_experts"}
            return WanExperts(self.meta_transformer(one, dtype), self.meta_transformer(one, dtype),
                              config["two_experts"])
        model = super().meta_transformer(config, dtype)
        rope = model.rope
        with torch.device("cpu"):
            model.rope = type(rope)(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
            C.keep_time_dtype(model)
        return model

    def block_classes(self):
        from diffusers.models.transformers.transformer_wan import WanTransformerBlock

        return (WanTransformerBlock,)

    def sequence_parallel_plan(self):
        """The video tokens split before the first block, gathered before the output norm; the
        self-attention attends across the sequence group (models/wan/sequence_parallel.py)."""
        from fastvideo.models.wan.sequence_parallel import wan_plan

        return wan_plan()

    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The transformer's tokens of one clip: latent frames x rows x columns after its 1x2x2 patches."""
        f, h, w = self.nominal_layout(height, width, transformer_config)["grid"]
        p_t, p_h, p_w = transformer_config["patch_size"]
        return (f // p_t) * (h // p_h) * (w // p_w)

    def sequence_channels(self, transformer_config):
        """The gather's tokens are the blocks' output, before the output norm: heads x head dimension wide."""
        heads, head_dim = self.attention_dims(transformer_config)
        return heads * head_dim

    # -- sampling
    def vae_geometry(self, vae_config) -> tuple[int, int]:
        """AutoencoderKLWan's: scale_factor_spatial pixels per cell (8; Wan2.2's 16), z_dim channels."""
        return int(config_value(vae_config, "scale_factor_spatial")), int(config_value(vae_config, "z_dim"))

    def nominal_layout(self, height, width, transformer_config) -> LatentLayout:
        """Wan2.1's VAE (8 pixels per cell) for a 16-channel transformer, Wan2.2's (16) for 48."""
        cell = 16 if transformer_config["in_channels"] == 48 else 8
        return self._layout(height, width, *latent_hw(height, width, cell), transformer_config["in_channels"])

    def _layout(self, height, width, latent_h, latent_w, channels, device=None) -> LatentLayout:
        return video_layout(height, width, latent_h, latent_w, channels, C.latent_frames(self.num_frames),
                            self.num_frames)

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["neg_prompt_embeds"],
                                  layout["grid"], self.scale, self.quantize_timestep, self.expand_timesteps,
                                  self.guidance_scale_2)

    def decode(self, vae, x0, layout) -> torch.Tensor:
        """Frames [B, F, 3, H, W] float32 in [0, 1]."""
        return C.decode_latents(vae, x0, layout["grid"])

    # -- cost model (text_tokens: the umT5 sequence length; image_tokens: latent cells, f h w)
    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """One velocity's FLOPs (both guidance passes under CFG), per-token timesteps as the folder says."""
        import fastvideo.models.wan.flops as F

        b, per_token = batch * self.cost_passes(config), self.expand_timesteps
        parts = F.transformer_flops_breakdown(config, image_tokens, text_tokens, b, per_token)
        return {**{k: v for k, v in parts.items() if k != "total"}, "forward": parts["total"],
                "blocks": parts["blocks"],
                "backward": F.transformer_backward_flops(config, image_tokens, text_tokens, b, per_token)}

    # -- cost model (text_tokens: the umT5 sequence length)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        b, m = batch * self.velocity_passes, "meta"
        f, h, w = layout["grid"]
        per_token = self.expand_timesteps or config["in_channels"] == 48  # 48 channels: Wan2.2-TI2V's (its VAE)
        return dict(hidden_states=torch.empty(b, config["in_channels"], f, h, w, device=m, dtype=dtype),
                    timestep=torch.empty(b, *((f * (h // 2) * (w // 2),) if per_token else ()), device=m,
                                         dtype=dtype),
                    encoder_hidden_states=torch.empty(b, text_tokens, config["text_dim"], device=m, dtype=dtype),
                    return_dict=False)

    def vae_decode_flops(self, vae_config, transformer_config, height, width) -> int:
        """One clip's decode, counted on the meta device (models/video_decode.py)."""
        return measured_decode_flops(self, vae_config, transformer_config, height, width)

    def meta_vae(self, vae_config, batch, layout, dtype):
        """(the causal AutoencoderKLWan, ``batch`` clips' latents [B, C, f, h, w]) on the meta device: what
        perf.memory decodes for its peak."""
        from diffusers import AutoencoderKLWan

        with torch.device("meta"):
            vae = AutoencoderKLWan.from_config({k: v for k, v in vae_config.items() if not k.startswith("_")})
        return vae.to(dtype), torch.empty(batch, vae_config["z_dim"], *layout["grid"], device="meta", dtype=dtype)
