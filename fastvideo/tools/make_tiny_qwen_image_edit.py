"""Write a complete diffusers-layout Qwen-Image-Edit (2509 / 2511) folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_qwen_image_edit OUT_DIR [--seed N]

Same structure as Qwen/Qwen-Image-Edit-2509, scaled down: the tiny Qwen-Image's transformer and VAE
(make_tiny_qwen_image: the edit model is the same QwenImageTransformer2DModel class), a Qwen2.5-VL text
encoder whose vision tower is used here (2 blocks, one windowed and one with full attention as the
7B's pattern, Qwen2.5-VL's 14-pixel patches, 2 frames a temporal patch, 2x2 merge), its
Qwen2VLProcessor built from configs in this file (Qwen2VLImageProcessor / Qwen2VLVideoProcessor with
Qwen2.5-VL's normalisation and pixel bounds; no hub), and the byte-level BPE tokenizer of
make_tiny_qwen_image with Qwen2.5-VL's vision tokens (<|vision_start|>, <|vision_end|>, <|image_pad|>,
<|video_pad|>) whose merges make the edit pipeline's system prompt 64 tokens, the 64 it drops
(prompt_template_encode_start_idx), split exactly where the real Qwen2.5 tokenizer splits it.
model_index.json names QwenImageEditPlusPipeline, which loads the folder offline and edits with it.
The same seed gives the same weights, bit for bit. Needs the current library line.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux2 import write_qwen_tokenizer
from fastvideo.tools.tiny_builder import new_folder, run_builder_cli, save_tiny_folder, wake_zero_projections
from fastvideo.tools.make_tiny_qwen_image import QWEN_IMAGE_SCHEDULER_CONFIG, TEXT_WIDTH, qwen2_5_vl
from fastvideo.tools.make_tiny_qwen_image import transformer_config, vae_config

# QwenImageEditPlusPipeline's system prompt (diffusers 0.42.1 prompt_template_encode, up to the user's text).
EDIT_SYSTEM_PREFIX = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n")
EDIT_PREFIX_TOKENS = 64  # the pipeline's prompt_template_encode_start_idx
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen2.5-VL's image processor (Qwen/Qwen-Image-Edit-2509 processor/preprocessor_config.json's values).
IMAGE_PROCESSOR = {
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
}
# The tiny vision tower: Qwen2.5-VL's patching (14 px, 2 frames, 2x2 merge, 112-px windows), 2 blocks:
# block 0 windowed, block 1 full attention (the 7B: full attention at 7, 15, 23, 31).
VISION = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TEXT_WIDTH,
              fullatt_block_indexes=[1], patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112)

def prefix_words() -> list[str]:
    """The edit system prompt's pre-tokens as Qwen2.5 splits them (words with their space, " (", "),",
    "'s"), longest first: each one's left-to-right merges then outrank every shorter word's."""
    text = EDIT_SYSTEM_PREFIX.replace("<|im_start|>", "\n").replace("<|im_end|>", "\n")
    return sorted(set(re.findall(r" ?[A-Za-z]+|'s|\),| \(", text)), key=lambda w: (-len(w), w))


def write_tokenizer(out: Path):
    """The tiny Qwen2 tokenizer with the vision tokens; -> the loaded tokenizer."""
    from transformers import AutoTokenizer

    write_qwen_tokenizer(out, prefix_words())
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS}, replace_extra_special_tokens=False)
    tok.save_pretrained(out)
    return tok


def write_processor(out: Path, tokenizer):
    """Qwen2VLProcessor (image processor, video processor, the tokenizer) from this file's configs."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    image = Qwen2VLImageProcessor(**IMAGE_PROCESSOR)
    video = Qwen2VLVideoProcessor(**{k: v for k, v in IMAGE_PROCESSOR.items() if k not in ("min_pixels", "max_pixels")})
    processor = Qwen2VLProcessor(image_processor=image, tokenizer=tokenizer, video_processor=video)
    processor.save_pretrained(out)
    return processor


def text_encoder(tokenizer):
    """make_tiny_qwen_image's Qwen2.5-VL with this file's vision tower and the tokenizer's vision ids."""
    ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
                   tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    bos, eos = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return qwen2_5_vl(len(tokenizer), bos, eos, vision=VISION, token_ids=ids)


def make_tiny_qwen_image_edit(out_dir: str | Path, seed: int = 0) -> Path:
    out = new_folder(out_dir, "the tiny Qwen-Image-Edit builder")
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    tokenizer = write_tokenizer(out / "tokenizer")
    write_processor(out / "processor", tokenizer)
    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel.from_config(transformer_config())
    vae = AutoencoderKLQwenImage.from_config(vae_config())
    encoder = text_encoder(tokenizer)
    wake_zero_projections(transformer, seed + 1)
    modules = {"transformer": transformer, "vae": vae, "text_encoder": encoder}
    named = {"processor": "Qwen2VLProcessor", "tokenizer": "Qwen2Tokenizer"}
    return save_tiny_folder(out, modules, QWEN_IMAGE_SCHEDULER_CONFIG, "QwenImageEditPlusPipeline", named)


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_qwen_image_edit", __doc__, lambda a: make_tiny_qwen_image_edit(a.out_dir, a.seed),
                    lambda a: "tiny Qwen-Image-Edit", argv)


if __name__ == "__main__":
    main()
