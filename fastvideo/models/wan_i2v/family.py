"""Wan2.1-I2V as a ModelFamily (--model_family wan_i2v, the current library line only): Wan's family
(loading, umT5 text, CFG with the negative prompt, video latents, decoding, FSDP blocks, --num_frames)
plus a first frame per prompt, as WanImageToVideoPipeline(image=...) runs it (components.py).

Prompts come as the editing families' JSONL file ({"prompt": ..., "image": ...}; fastvideo.data.sources);
preprocessing encodes each source once at --num_frames (its VAE condition depends on the clip's
length) and the sources' own size, which is the clip's (--h / --w). Conditioning: Wan's
TensorConditioning plus per sample "condition" [B, 4 + z, f, h, w], "image_embeds" [B, N, Di] (CLIP's)
and "source_image" [B, 3, H, W] (what the rewards that use sources and the evaluation grids see).
Stored per prompt in condition/, image_embeds/ and source_image/. The text is stored at 512 tokens:
the transformer takes the last 512 of its context as the text (WanAttnProcessor).
"""

from __future__ import annotations

from dataclasses import replace

import torch

import fastvideo.models.wan_i2v.components as C
from fastvideo.errors import UserError
from fastvideo.models import base, record_checks
from fastvideo.models.base import EmbeddingShapeError, TensorConditioning, config_value
from fastvideo.models.latents import latent_hw, to_tokens
from fastvideo.models.wan import components as W
from fastvideo.models.wan.family import WanFamily
from fastvideo.models.wan.reference import I2V_MODELS

SOURCE_NAMES = ("condition", "image_embeds", "source_image")


class WanI2VFamily(WanFamily):
    """Wan image-to-video; guidance_scale, quantize_timestep and num_frames as Wan's."""

    name = "wan_i2v"
    variant_of = "wan"  # WanTransformer3DModel; a checkpoint's family is its run's config.json model.family
    pipeline_class_name = "WanImageToVideoPipeline"
    edits = True  # every prompt has a source image (its first frame)
    takes_last_image = True  # a JSONL record's "last_image": the last frame too (WanImageToVideoPipeline's)
    source_use = "makes each clip from a first frame (its source image)"  # preprocessing's refusal of a .txt file
    source_multiple = 16  # WanImageToVideoPipeline.check_inputs: height and width divisible by 16
    storage, json_keys = base.storage_with(WanFamily, *SOURCE_NAMES)
    parts = replace(WanFamily.parts, load_text_encoders=C.load_encoders)
    text_components = WanFamily.text_components + ("vae", "image_encoder", "image_processor")
    text_encoder_components = WanFamily.text_encoder_components + ("vae", "image_encoder")
    made_by = "Wan image-to-video preprocessing (--model_family wan_i2v)"
    runs_on = "wan"  # Wan2.2-TI2V-5B's folder (WanPipeline, expand_timesteps) is image-to-video's too
    # the cost model's --model names: the published image-to-video transformers (models/wan/reference.py)
    reference_config, reference_vae_config, reference_name = I2V_MODELS["wan2.1-i2v-14b-480p"]
    reference_models = I2V_MODELS

    def _note_variant(self, root) -> None:
        """Wan's; a WanPipeline folder is refused unless it has expand_timesteps (Wan2.2-TI2V-5B, whose
        first latent frame WanImageToVideoPipeline gives: no condition channels in its transformer)."""
        super()._note_variant(root)
        if not self.expand_timesteps and C.pipeline_class(root) == "WanPipeline":
            raise W.WanFolderError(f"{root} holds a text-to-video Wan (WanPipeline without expand_timesteps): "
                                   "image-to-video takes Wan2.1-I2V, Wan2.2-I2V-A14B or Wan2.2-TI2V-5B; pass "
                                   "--model_family wan for it")

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        self._note_variant(path)  # preprocessing encodes the condition as the folder's variant does
        return super().load_text_encoders(path, device, dtype)

    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        return super().encode_prompts(getattr(encoders, "text", encoders), prompts, max_sequence_length)

    def encode_sources(self, encoders, cond, pixels) -> TensorConditioning:
        """pixels [P, 3, H, W], or [P, 2, 3, H, W] for records with a "last_image" (first, last frame)."""
        pixels, last = pixels.to(encoders.device), None
        if pixels.ndim == 5:  # {"image": ..., "last_image": ...} records (data.sources.FrameEnds)
            C.check_last_image(encoders)
            pixels, last = pixels[:, 0], pixels[:, 1]
        condition = (C.encode_first_latents(encoders.vae, pixels) if encoders.expand_timesteps
                     else C.encode_condition(encoders.vae, pixels, self.num_frames, last))
        per = {"condition": condition,
               "image_embeds": C.encode_image(encoders.image_encoder, encoders.image_processor, pixels),
               "source_image": pixels.float()}  # image_embeds [P, 0, 0]: a folder without CLIP (Wan2.2-I2V-A14B)
        return TensorConditioning({**cond.tensors, **per}, dict(cond.shared))

    def source_images(self, cond) -> torch.Tensor:
        return cond["source_image"].float()

    def encoder_dims(self, encoders) -> dict[str, int]:
        vae = encoders.vae.config
        clip = None if encoders.image_encoder is None else encoders.image_encoder.config
        return {**super().encoder_dims(encoders.text), "latent_channels": int(vae.z_dim),
                "given_first": int(encoders.expand_timesteps),
                "vae_scale": int(vae.scale_factor_spatial),
                "image_tokens": 0 if clip is None else (clip.image_size // clip.patch_size) ** 2 + 1,
                "image_dim": 0 if clip is None else int(clip.hidden_size)}

    def record_shapes(self, max_sequence_length, encoder_dims):
        h, w = encoder_dims["source_height"], encoder_dims["source_width"]
        lat_h, lat_w = latent_hw(h, w, encoder_dims["vae_scale"])
        frames, mask = W.latent_frames(self.num_frames), C.MASK_CHANNELS
        if encoder_dims.get("given_first"):  # Wan2.2-TI2V-5B: the first frame's latents alone
            frames, mask = 1, 0
        return (*super().record_shapes(max_sequence_length, encoder_dims),
                (mask + encoder_dims["latent_channels"], frames, lat_h, lat_w),
                (encoder_dims["image_tokens"], encoder_dims["image_dim"]), (3, h, w))

    def cond_from_tensors(self, records) -> TensorConditioning:
        cond = super().cond_from_tensors(records)
        per = {n: torch.stack([r[n] for r in records]) for n in SOURCE_NAMES}
        return TensorConditioning({**cond.tensors, **per}, dict(cond.shared))

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D, Cc, f, h, w, N, Di, H, W)): Wan's checks, the source tensors' shapes."""
        rec, text_dims = super().check_record(idx, record, first_dims[:2] if first_dims else None, where)
        cond, embeds, pix = (record[n] for n in SOURCE_NAMES)
        if cond.ndim != 4 or embeds.ndim != 2 or pix.ndim != 3 or pix.shape[0] != 3:
            raise EmbeddingShapeError(
                f"prompt {idx}: condition {tuple(cond.shape)} / image_embeds {tuple(embeds.shape)} / source_image "
                f"{tuple(pix.shape)} should be [4 + C, f, h, w] / [N, D] / [3, H, W]; re-run the preprocessing")
        dims = (*text_dims, *cond.shape, *embeds.shape, *pix.shape[1:])
        record_checks.check_first_dims(idx, dims, first_dims, where, "(L, D, Cc, f, h, w, N, Di, H, W)",
                              "two preprocessing runs or source sizes")
        return {**rec, **{n: record[n] for n in SOURCE_NAMES}}, dims

    def check_run_size(self, dims, height, width) -> None:
        """The stored first frames (dims' last two: H, W) are the clips' size: --h / --w must be theirs."""
        if tuple(dims[-2:]) != (height, width):
            raise UserError(f"the stored first frames are {dims[-1]}x{dims[-2]} (W x H), this run makes {width}x"
                            f"{height} clips: give --h / --w the source images' size (--h {dims[-2]} --w "
                            f"{dims[-1]}), or re-run the preprocessing with sources of {width}x{height}")

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        """Wan's text checks; 512 text tokens; the condition's channels and frames, the CLIP width."""
        super().check_dims(dims[:2], transformer_config, max_sequence_length)
        if len(dims) <= 2:
            return
        seq, channels, frames, image_dim = dims[0], dims[2], dims[3], dims[7]
        if seq != C.TEXT_TOKENS:
            raise EmbeddingShapeError(f"the prompt embeddings have {seq} tokens; Wan image-to-video's transformer "
                                      f"takes the last {C.TEXT_TOKENS} of its context as the text: re-run the "
                                      f"preprocessing with --max_sequence_length {C.TEXT_TOKENS}")
        in_channels, out_channels = (config_value(transformer_config, k) for k in ("in_channels", "out_channels"))
        if self.expand_timesteps:  # Wan2.2-TI2V-5B: the first latent frame itself, no condition channels
            return self._check_given_first(channels, frames, in_channels)
        if in_channels is not None and out_channels is not None and channels + out_channels != in_channels:
            raise EmbeddingShapeError(f"the stored condition has {channels} channels, the transformer takes "
                                      f"{in_channels} = {out_channels} latents + the condition: re-run the "
                                      "preprocessing with this model's folder")
        if frames != W.latent_frames(self.num_frames):
            raise EmbeddingShapeError(f"the stored first frames were encoded for clips of {4 * (frames - 1) + 1} "
                                      f"frames, this run makes {self.num_frames}: re-run the preprocessing with "
                                      f"--num_frames {self.num_frames}")
        record_checks.check_width("stored CLIP features", image_dim, transformer_config, "image_dim",
                         "re-run the preprocessing with this model's folder")
        if config_value(transformer_config, "image_dim") is None and in_channels is not None and image_dim:
            raise EmbeddingShapeError("the stored first frames come with CLIP features, which this transformer (no "
                                      "image_dim: Wan2.2-I2V-A14B) does not take: re-run the preprocessing with "
                                      "this model's folder")

    def check_cond(self, cond) -> None:
        """Wan's shapes; the text at 512 tokens (held-out prompts encoded at another length would be split
        wrongly into image and text tokens by the transformer), a condition and CLIP features per prompt."""
        super().check_cond(cond)
        rows, tokens = cond["prompt_embeds"].shape[:2]
        if tokens != C.TEXT_TOKENS:
            raise EmbeddingShapeError(f"prompt embeddings of {tokens} tokens: Wan image-to-video's transformer takes "
                                      f"{C.TEXT_TOKENS} (encode the prompts with --max_sequence_length "
                                      f"{C.TEXT_TOKENS}, held-out ones with --eval_max_sequence_length "
                                      f"{C.TEXT_TOKENS})")
        if cond["condition"].ndim != 5 or cond["condition"].shape[0] != rows or cond["image_embeds"].shape[0] != rows:
            raise ValueError(f"condition must be [P, 4 + C, f, h, w] and image_embeds [P, N, D] for {rows} prompts, got "
                             f"{tuple(cond['condition'].shape)} and {tuple(cond['image_embeds'].shape)}")

    def _check_given_first(self, channels, frames, in_channels) -> None:
        if frames != 1 or (in_channels is not None and channels != in_channels):
            raise EmbeddingShapeError(f"the stored condition is {channels} channels x {frames} latent frames; this "
                                      f"folder (expand_timesteps: Wan2.2-TI2V-5B) takes its first frame's "
                                      f"{in_channels} latent channels x 1 frame: re-run the preprocessing with "
                                      "this model's folder")

    def token_channels(self, in_channels: int) -> int:
        """The noisy latents' channels: in_channels less the condition's (4 + the same latents); all of
        them with expand_timesteps (Wan2.2-TI2V-5B: the condition is the first latent frame itself)."""
        return in_channels if self.expand_timesteps else (in_channels - C.MASK_CHANNELS) // 2

    def _layout(self, height, width, latent_h, latent_w, channels, device=None):
        """Wan's; with expand_timesteps the first latent frame's tokens are "fixed_tokens": given, not
        generated, they are no action of the policy (no SDE noise, no log-probability term)."""
        layout = super()._layout(height, width, latent_h, latent_w, channels, device)
        if not self.expand_timesteps:
            return layout
        return replace(layout, extras={**layout.extras, "fixed_tokens": latent_h * latent_w})

    def nominal_layout(self, height, width, transformer_config):
        return super().nominal_layout(height, width, {**transformer_config,
                                                      "in_channels": transformer_config["out_channels"]})

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        condition = cond["condition"]
        grid = tuple(layout["grid"])
        if tuple(condition.shape[2:]) != ((1, *grid[1:]) if self.expand_timesteps else grid):
            raise EmbeddingShapeError(
                f"the stored first frames make a latent grid (f, h, w) {tuple(condition.shape[2:])}, this run's "
                f"clips {tuple(layout['grid'])}: give --h / --w the source images' size and --num_frames the "
                "preprocessing's")
        if self.expand_timesteps:  # Wan2.2-TI2V-5B: the first latent frame given, its tokens at timestep 0
            def predict(x_in):
                return W.predict_velocity(transformer, x_in, sigma, cond["prompt_embeds"], cond["neg_prompt_embeds"],
                                          grid, self.scale, self.quantize_timestep, True, self.guidance_scale_2,
                                          given_first=True)
            return C.given_first_frame_velocity(predict, x, sigma, to_tokens(condition))
        image = {"condition": condition}
        if cond["image_embeds"].shape[1]:  # a folder without CLIP stores [B, 0, 0] (Wan2.2-I2V-A14B)
            image["image_embeds"] = cond["image_embeds"]
        return W.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["neg_prompt_embeds"],
                                  layout["grid"], self.scale, self.quantize_timestep, self.expand_timesteps,
                                  self.guidance_scale_2, image)

    def cond_numel(self, config, text_tokens) -> int:
        """Wan's text plus the CLIP features (257 x image_dim for Wan2.1-I2V's ViT-H/14)."""
        return super().cond_numel(config, text_tokens) + 257 * int(config_value(config, "image_dim") or 0)

    # -- cost model: the CLIP image tokens of Wan2.1-I2V (257: ViT-H/14's 16 x 16 patches and its class token)
    clip_tokens = 257

    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        """Wan's inputs with the condition in the latents' channels (in_channels 36) and, for a transformer
        with image_dim, the CLIP features [B, 257, image_dim] (encoder_hidden_states_image)."""
        inputs = super().meta_inputs(config, batch, layout, text_tokens, dtype)
        image_dim = config_value(config, "image_dim")
        if image_dim:
            rows = inputs["hidden_states"].shape[0]
            inputs["encoder_hidden_states_image"] = torch.empty(rows, self.clip_tokens, int(image_dim), device="meta",
                                                                dtype=dtype)
        return inputs

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """Wan's count plus the CLIP image tokens' (models/wan/flops.py image_context_flops) where the
        transformer takes them (image_dim: Wan2.1-I2V; Wan2.2-I2V-A14B has none)."""
        import fastvideo.models.wan.flops as F

        counts = super().transformer_flops(config, image_tokens, text_tokens, batch)
        if not config_value(config, "image_dim"):
            return counts
        extra = F.image_context_flops(config, image_tokens, self.clip_tokens, batch * self.cost_passes(config))
        forward = extra["image_embedder"] + extra["image_attention"]
        return {**counts, "image_embedder": extra["image_embedder"], "image_attention": extra["image_attention"],
                "forward": counts["forward"] + forward, "blocks": counts["blocks"] + extra["image_attention"],
                "backward": counts["backward"] + extra["backward"]}
