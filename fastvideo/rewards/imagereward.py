"""ImageReward (Xu et al. 2023) with transformers' BLIP modules, loaded pickle-free.

ImageReward scores (image, prompt) with BLIP: a ViT image encoder, a BERT text encoder that
cross-attends to all image tokens, and a five-layer MLP on the text's [CLS] feature (the same
activation-free layout as the LAION aesthetic MLP). We reproduce the ``image-reward`` package's
``ImageReward.score`` (checked in tests/rewards/test_reward_imagereward_parity.py):

1. the image: CLIP's eval transform at 224 (shorter side bicubic, centre crop, OpenAI mean/std);
2. the prompt: bert-base-uncased WordPiece with BLIP's two added tokens ([DEC], [ENC]), padded
   to 35 tokens and truncated there;
3. ``(mlp(text_encoder(ids, mask, image_tokens)[:, 0]) - 0.16717362830052426) /
   1.0333394966054072`` (the package's fixed normalisation).

Files in ``image_reward_dir`` (what MixGRPO expects, plus the tokenizer the package fetched from
the hub): ``ImageReward.pt`` (a plain state dict, read with weights_only=True),
``med_config.json`` (the BERT config) and bert-base-uncased's ``vocab.txt`` (directly or in
``tokenizer/``). The ViT's size is read from the checkpoint (ImageReward v1.0: ViT-L/16, 24 blocks,
width 1024); heads = width / 64, as in every BLIP ViT.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from fastvideo.rewards.aesthetic import AestheticMLP, clip_preprocess
from fastvideo.rewards.base import BatchedReward, CheckpointError, ImageBatch, as_pils
from fastvideo.rewards.base import load_state_dict_strict, load_weights_only
from fastvideo.rewards.weights import default_folder, where_to_get

DEFAULT_IMAGE_REWARD_DIR = default_folder("imagereward")
IMAGE_REWARD_FILE = "ImageReward.pt"
MED_CONFIG_FILE = "med_config.json"
# The package's fixed score normalisation and prompt length.
SCORE_MEAN = 0.16717362830052426
SCORE_STD = 1.0333394966054072
MAX_PROMPT_TOKENS = 35
IMAGE_SIZE = 224
VIT_HEAD_WIDTH = 64
VIT_LAYER_NORM_EPS = 1e-6
# Checkpoint entries the score does not use (BLIP's contrastive projections, a saved buffer).
UNUSED_KEYS = ("blip.vision_proj.", "blip.text_proj.", "blip.text_encoder.embeddings.position_ids")


def resolve_image_reward_files(folder: str | Path) -> tuple[Path, Path, Path]:
    """(ImageReward.pt, med_config.json, tokenizer folder) or an error naming what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"ImageReward folder {str(folder)!r} does not exist; it must hold {IMAGE_REWARD_FILE}, "
            f"{MED_CONFIG_FILE} and vocab.txt: {where_to_get('imagereward', str(folder))}.")
    tok = next((d for d in (folder, folder / "tokenizer") if (d / "vocab.txt").is_file()), None)
    missing = [n for n in (IMAGE_REWARD_FILE, MED_CONFIG_FILE) if not (folder / n).is_file()]
    missing += [] if tok is not None else ["vocab.txt (bert-base-uncased tokenizer)"]
    if missing:
        raise FileNotFoundError(
            f"ImageReward folder {str(folder)!r} lacks {', '.join(missing)}: {where_to_get('imagereward', str(folder))}.")
    return folder / IMAGE_REWARD_FILE, folder / MED_CONFIG_FILE, tok


# BLIP's timm ViT names -> transformers' BlipVisionModel names: whole keys, then parts of keys.
_VISION_KEYS = {"cls_token": "embeddings.class_embedding", "pos_embed": "embeddings.position_embedding",
                "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
                "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
                "norm.weight": "post_layernorm.weight", "norm.bias": "post_layernorm.bias"}
_VISION_PARTS = ((".norm1.", ".layer_norm1."), (".norm2.", ".layer_norm2."), (".attn.proj.", ".self_attn.projection."),
                 (".attn.qkv.", ".self_attn.qkv."))
_VISION_BLOCKS = ("blocks.", "encoder.layers.")  # the leading block prefix, replaced once


def vision_key(key: str, inverse: bool = False) -> str:
    """BLIP ViT (timm naming) -> transformers BlipVisionModel naming; ``inverse`` maps back (the tiny
    checkpoint writer saves in BLIP's naming). One table serves both directions."""
    whole = {v: k for k, v in _VISION_KEYS.items()} if inverse else _VISION_KEYS
    if key in whole:
        return whole[key]
    for old, new in _VISION_PARTS:
        key = key.replace(new, old) if inverse else key.replace(old, new)
    old, new = _VISION_BLOCKS[::-1] if inverse else _VISION_BLOCKS
    return key.replace(old, new, 1)


def split_checkpoint(sd: dict[str, torch.Tensor], source: str) -> dict[str, dict[str, torch.Tensor]]:
    """ImageReward.pt -> {"vision": ..., "text": ..., "mlp": ...} in our modules' key names."""
    parts: dict[str, dict[str, torch.Tensor]] = {"vision": {}, "text": {}, "mlp": {}}
    unknown = []
    for key, value in sd.items():
        if key.startswith(UNUSED_KEYS):
            continue
        if key.startswith("blip.visual_encoder."):
            parts["vision"][vision_key(key[len("blip.visual_encoder."):])] = value.float()
        elif key.startswith("blip.text_encoder."):
            parts["text"][key[len("blip.text_encoder."):]] = value.float()
        elif key.startswith("mlp."):
            parts["mlp"][key[len("mlp."):]] = value.float()
        else:
            unknown.append(key)
    if unknown or not all(parts.values()):
        raise CheckpointError(
            f"{source} is not an ImageReward checkpoint: unexpected keys {unknown[:5]}, "
            f"{', '.join(k for k, v in parts.items() if not v) or 'no'} part(s) missing. "
            f"Get it: {where_to_get('imagereward')}.")
    return parts


def build_vision(vision_sd: dict[str, torch.Tensor]) -> nn.Module:
    """A BlipVisionModel sized from the checkpoint's tensors."""
    from transformers import BlipVisionConfig, BlipVisionModel

    width = vision_sd["embeddings.class_embedding"].shape[-1]
    patch = vision_sd["embeddings.patch_embedding.weight"].shape[-1]
    grid = round((vision_sd["embeddings.position_embedding"].shape[1] - 1) ** 0.5)
    depth = len({k.split(".")[2] for k in vision_sd if k.startswith("encoder.layers.")})
    mlp = vision_sd["encoder.layers.0.mlp.fc1.weight"].shape[0]
    config = BlipVisionConfig(hidden_size=width, intermediate_size=mlp, num_hidden_layers=depth,
                              num_attention_heads=max(1, width // VIT_HEAD_WIDTH), image_size=grid * patch,
                              patch_size=patch, hidden_act="gelu", layer_norm_eps=VIT_LAYER_NORM_EPS)
    return BlipVisionModel(config)


def build_text(med_config: Path, vision_width: int) -> nn.Module:
    """BlipTextModel from BLIP's med_config.json (a BERT config with cross-attention)."""
    from transformers import BlipTextConfig, BlipTextModel

    cfg = json.loads(med_config.read_text())
    config = BlipTextConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], encoder_hidden_size=vision_width,
        intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"], max_position_embeddings=cfg["max_position_embeddings"],
        hidden_act=cfg.get("hidden_act", "gelu"), layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
        pad_token_id=cfg.get("pad_token_id", 0),
        # is_decoder makes transformers build the cross-attention blocks; we still call the
        # model with is_decoder=False (bidirectional self-attention), as BLIP's encoder runs.
        is_decoder=True,
    )
    return BlipTextModel(config, add_pooling_layer=False)


def load_tokenizer(folder: Path):
    """bert-base-uncased WordPiece + BLIP's added [DEC] (bos) and [ENC] tokens."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


class ImageRewardReward(BatchedReward):
    """ImageReward per (image, its own prompt); float32 ``[B]`` on CPU (about -2..2 for real images).

    Args:
        image_reward_dir: folder with ImageReward.pt, med_config.json and vocab.txt (module doc).
        device, dtype, batch_size: see BatchedReward.
    """

    name = "imagereward"

    def __init__(self, image_reward_dir: str | Path = DEFAULT_IMAGE_REWARD_DIR, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None, batch_size: int = 8) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        ckpt, med_config, tok_dir = resolve_image_reward_files(image_reward_dir)
        sd = load_weights_only(ckpt)
        if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
            sd = sd["state_dict"]
        parts = split_checkpoint(sd, str(ckpt))
        self.vision = build_vision(parts["vision"])
        load_state_dict_strict(self.vision, parts["vision"], f"{ckpt} (blip.visual_encoder)")
        self.text = build_text(med_config, self.vision.config.hidden_size)
        load_state_dict_strict(self.text, parts["text"], f"{ckpt} (blip.text_encoder) with {med_config}")
        self.mlp = AestheticMLP(self.text.config.hidden_size)
        load_state_dict_strict(self.mlp, parts["mlp"], f"{ckpt} (mlp)")
        for module in (self.vision, self.text, self.mlp):
            module.eval().requires_grad_(False).to(self.device)
        self.tokenizer = load_tokenizer(tok_dir)
        if len(self.tokenizer) > self.text.config.vocab_size:
            raise CheckpointError(f"tokenizer in {tok_dir} has {len(self.tokenizer)} tokens but {med_config} "
                                  f"has vocab_size {self.text.config.vocab_size}: not bert-base-uncased's?")
        self.transform = clip_preprocess(self.vision.config.image_size)

    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        pixels = torch.stack([self.transform(im) for im in as_pils(images)]).to(self.device)
        text = self.tokenizer(list(prompts), padding="max_length", truncation=True,
                              max_length=MAX_PROMPT_TOKENS, return_tensors="pt")
        with self.autocast():
            image_tokens = self.vision(pixel_values=pixels).last_hidden_state
            image_mask = torch.ones(image_tokens.shape[:-1], dtype=torch.long, device=self.device)
            out = self.text(input_ids=text["input_ids"].to(self.device),
                            attention_mask=text["attention_mask"].to(self.device),
                            encoder_hidden_states=image_tokens, encoder_attention_mask=image_mask,
                            is_decoder=False, return_dict=True)
        features = out.last_hidden_state[:, 0, :].float()  # the [CLS] token
        return (self.mlp(features) - SCORE_MEAN) / SCORE_STD
