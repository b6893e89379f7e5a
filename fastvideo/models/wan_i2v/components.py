"""Wan image-to-video's own pieces; everything else is Wan's (fastvideo.models.wan.components).

WanImageToVideoPipeline conditions on a first frame, given per prompt as its source image:

    source [3, H, W] in [0, 1] -> 2x - 1 (VideoProcessor.preprocess), followed by F - 1 black (zero)
    frames -> AutoencoderKLWan's mode (argmax) -> (z - latents_mean) * (1 / latents_std): the first
    frame's latents [z, f, h, w]; the mask [4, f, h, w]: 1 on the first pixel frame (repeated over the
    VAE's 4 frames of the first latent frame), 0 after -> condition = [mask ; latents] [4 + z, f, h, w]
    CLIP: CLIPImageProcessor on the source image, CLIPVisionModel's second-last hidden state [N, Di]
    velocity: the transformer on [noisy latents ; condition] (16 + 4 + 16 = 36 channels for Wan2.1)
    with encoder_hidden_states_image = the CLIP features, for the conditional and the negative rows

The source is used at the clip's own size (the pipeline resizes it to height x width first; here the
sources are the clip's size, sides multiples of 16). Every name of diffusers or transformers is
imported inside a function: this module is imported on the recipe line too (the registry).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastvideo.models import parts
from fastvideo.models.wan import components as W

MASK_CHANNELS = 4  # the first frame's mask, one channel per pixel frame of a latent frame (scale_factor_temporal)
# WanAttnProcessor splits encoder_hidden_states as [image tokens ; the last 512 text tokens]
# (transformer_wan.py: "512 is the context length of the text encoder, hardcoded for now"): an
# image-to-video transformer needs umT5 embeddings of exactly 512 tokens.
TEXT_TOKENS = 512
IMAGE_FILES = {"image_encoder": ("config.json",), "image_processor": ("preprocessor_config.json",)}
check_image_encoder = parts.folder_checker(IMAGE_FILES, W.WAN_DOWNLOAD_HINT, W.WanFolderError,
                                           "Wan image-to-video model folder")


@dataclass
class I2VEncoders:
    """umT5 (Wan's TextEncoder), the VAE that encodes the first frame, and the CLIP image encoder with
    its processor (None for a folder without one: Wan2.2's image-to-video); expand_timesteps: the folder's
    (Wan2.2-TI2V-5B: the first frame's latents alone are the condition)."""

    text: W.TextEncoder
    vae: torch.nn.Module
    image_encoder: torch.nn.Module | None
    image_processor: object | None
    expand_timesteps: bool = False

    @property
    def device(self) -> torch.device:
        return self.text.device


def has_image_encoder(root) -> bool:
    """Whether model_index.json names an image_encoder (Wan2.1-I2V: CLIP; Wan2.2-I2V-A14B: [null, null])."""
    import json
    from pathlib import Path

    try:
        entry = json.loads((Path(root) / "model_index.json").read_text(encoding="utf-8")).get("image_encoder")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(entry, list) and len(entry) == 2 and entry[1] is not None


def pipeline_class(root) -> str | None:
    """model_index.json's _class_name (None when the file is absent or unreadable)."""
    import json
    from pathlib import Path

    try:
        return json.loads((Path(root) / "model_index.json").read_text(encoding="utf-8")).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None


def load_encoders(path, device="cpu", dtype=torch.float32) -> I2VEncoders:
    """The text encoder, the VAE and (when the folder has one) CLIPVisionModel and CLIPImageProcessor."""
    import transformers

    text = W.load_text_encoder(path, device, dtype)
    vae = W.load_vae(path, device, dtype)
    if not has_image_encoder(path):
        return I2VEncoders(text, vae, None, None, W.expand_timesteps(path))
    root = check_image_encoder(path)
    encoder = transformers.CLIPVisionModel.from_pretrained(root, subfolder="image_encoder", dtype=dtype)
    processor = transformers.CLIPImageProcessor.from_pretrained(root, subfolder="image_processor")
    return I2VEncoders(text, vae, encoder.requires_grad_(False).eval().to(device), processor)


def check_last_image(encoders: I2VEncoders) -> None:
    """A last frame (the pipeline's last_image) is taken by a folder without expand_timesteps and without
    CLIP (Wan2.2-I2V-A14B); else UserError in one line: WanImageToVideoPipeline ignores it with
    expand_timesteps (Wan2.2-TI2V-5B), and with CLIP it passes both images' features, which Wan2.1-I2V's
    transformer cannot take (Wan2.1-FLF2V's paired image tokens are not supported here yet)."""
    from fastvideo.errors import UserError

    if encoders.expand_timesteps:
        raise UserError('the prompt file gives a "last_image" but Wan2.2-TI2V-5B (expand_timesteps) takes the first '
                        "frame alone (WanImageToVideoPipeline ignores last_image there): remove the \"last_image\" keys")
    if encoders.image_encoder is not None:
        raise UserError('the prompt file gives a "last_image" but this folder conditions on CLIP features '
                        "(Wan2.1-I2V / -FLF2V); a last frame is taken without CLIP only (Wan2.2-I2V-A14B): remove "
                        'the "last_image" keys or use such a folder')


def first_frame_mask(batch: int, num_frames: int, latent_h: int, latent_w: int, last: bool = False) -> torch.Tensor:
    """[B, 4, f, h, w] float32, as WanImageToVideoPipeline.prepare_latents builds it: one on the first
    pixel frame (and with ``last`` on the last one: its last_image) and zero between, the first frame
    repeated 4 times, folded 4 pixel frames a latent frame."""
    mask = torch.ones(batch, 1, num_frames, latent_h, latent_w)
    mask[:, :, 1:num_frames - 1 if last else num_frames] = 0
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=MASK_CHANNELS)
    mask = torch.cat([first, mask[:, :, 1:]], dim=2)
    return mask.view(batch, -1, MASK_CHANNELS, latent_h, latent_w).transpose(1, 2)


@torch.no_grad()
def encode_condition(vae, pixels: torch.Tensor, num_frames: int, last: torch.Tensor | None = None) -> torch.Tensor:
    """First frames [P, 3, H, W] in [0, 1] -> the condition [P, 4 + z, f, h, w] float32 of a clip of
    ``num_frames`` (the module docstring; prepare_latents' arithmetic, in its order). ``last`` [P, 3, H, W]
    (the pipeline's last_image): the clip's last pixel frame instead of a black one, the mask one on it too."""
    image = (pixels.float() * 2.0 - 1.0).unsqueeze(2)
    between = num_frames - 1 if last is None else num_frames - 2
    ends = [] if last is None else [(last.float() * 2.0 - 1.0).unsqueeze(2)]
    video = torch.cat([image, image.new_zeros(image.shape[0], 3, between, *image.shape[-2:]), *ends], dim=2)
    z = _normalised_latents(vae, video)
    mask = first_frame_mask(z.shape[0], num_frames, *z.shape[-2:], last=last is not None)
    return torch.cat([mask.to(z), z], dim=1)


@torch.no_grad()
def encode_first_latents(vae, pixels: torch.Tensor) -> torch.Tensor:
    """First frames [P, 3, H, W] in [0, 1] -> their latents [P, z, 1, h, w] float32, normalised: the
    condition of a folder with ``expand_timesteps`` (Wan2.2-TI2V-5B; prepare_latents encodes the image
    alone, no zero frames after it, no mask channels: the first latent frame is given, not generated)."""
    return _normalised_latents(vae, (pixels.float() * 2.0 - 1.0).unsqueeze(2))


def _normalised_latents(vae, video: torch.Tensor) -> torch.Tensor:
    """Pixels [P, 3, F, H, W] in [-1, 1] -> the VAE's mode, (z - latents_mean) * (1 / latents_std), float32."""
    z = vae.encode(video.to(next(vae.parameters()).dtype)).latent_dist.mode().float()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(z)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(z)
    return (z - mean) * inv_std


def given_first_frame_velocity(predict, x: torch.Tensor, sigma, first: torch.Tensor) -> torch.Tensor:
    """The velocity [B, L, C] of a clip whose first latent frame is given (``first`` [B, n, C], its n
    tokens; Wan2.2-TI2V-5B image-to-video): ``predict`` (the transformer's velocity) sees the latents
    with the first frame's tokens replaced by ``first`` ((1 - mask) * condition + mask * latents in
    WanImageToVideoPipeline, exact: a concatenation); its first frame's output is replaced by
    (x - first) / sigma, which does not depend on the model: x0 = x - sigma v is ``first`` there (what is
    decoded), the step's mean follows the straight line to it, and an objective that compares
    velocities finds no difference on those tokens. The rollout holds those tokens out of the SDE's
    log-probabilities (the layout's "fixed_tokens"; sampling.rollout.sde_transition)."""
    n = first.shape[1]
    first = first.to(x.device, torch.float32)
    v = predict(torch.cat([first.to(x.dtype), x[:, n:]], dim=1))
    s = parts.per_sample_sigma(sigma, x.shape[0], x.device).view(-1, 1, 1)
    return torch.cat([(x[:, :n].float() - first) / s, v[:, n:]], dim=1)


@torch.no_grad()
def encode_image(encoder, processor, pixels: torch.Tensor) -> torch.Tensor:
    """Source images [P, 3, H, W] in [0, 1] (values k / 255) -> CLIP features [P, N, Di]: the pipeline's
    encode_image (the processor on the 8-bit image, the vision model's second-last hidden state); [P, 0, 0]
    without an encoder."""
    from PIL import Image

    if encoder is None:  # a folder without an image encoder (Wan2.2-I2V-A14B): no CLIP features
        return torch.zeros(pixels.shape[0], 0, 0, device=pixels.device)
    images = [Image.fromarray(p.mul(255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()) for p in pixels]
    inputs = processor(images=images, return_tensors="pt").to(encoder.device)
    inputs["pixel_values"] = inputs["pixel_values"].to(next(encoder.parameters()).dtype)
    return encoder(**inputs, output_hidden_states=True).hidden_states[-2]
