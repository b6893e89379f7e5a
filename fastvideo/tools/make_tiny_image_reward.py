"""A tiny random ImageReward folder in the real layout (used by make_tiny_reward):

    ImageReward.pt      state dict with the image-reward package's key names (blip.visual_encoder.*
                        in timm ViT naming, blip.text_encoder.*, blip.vision_proj/text_proj,
                        mlp.layers.*), float32
    med_config.json     BERT config with cross-attention, as the package ships it (sizes tiny)
    vocab.txt ...       a tiny lower-case WordPiece vocabulary (BertTokenizer.save_pretrained)

The ViT keeps BLIP's 224 input and 16-pixel patches (the package hard-codes 224) but is 2 blocks of
width 64 (one 64-wide head).
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

import torch

TINY_VIT = {"width": 64, "depth": 2, "mlp": 128, "patch": 16, "image_size": 224}
TINY_MED = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "max_position_embeddings": 40}
WORDS = ["a", "red", "cube", "on", "the", "table", "dog", "running", "beach", "blue", "sky", "over",
         "mountains", "cafe", "at", "night", "with", "long", "prompt", "about", "castle", "very"]


def write_vocab(folder: Path) -> int:
    """A WordPiece vocabulary: BERT's specials, a few words, letters, digits, punctuation and ##letters."""
    from transformers import BertTokenizer

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = specials + WORDS + chars + ["##" + c for c in string.ascii_lowercase + string.digits]
    text = "\n".join(dict.fromkeys(tokens)) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Path(tmp) / "vocab.txt"
        vocab.write_text(text)
        # from_pretrained reads vocab.txt on both library lines (transformers 5's constructor takes
        # the vocabulary itself, not its file).
        tokenizer = BertTokenizer.from_pretrained(tmp, do_lower_case=True, model_max_length=512)
    tokenizer.save_pretrained(str(folder))
    if not (folder / "vocab.txt").is_file():  # transformers 5 saves tokenizer.json alone; the hub folder has vocab.txt
        (folder / "vocab.txt").write_text(text)
    return len(tokenizer)


def _randomise(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Weights far from transformers' small init, so every part of the model moves the score."""
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=generator)
        p.data = 1.0 + 0.1 * noise if "norm" in name.lower() and name.endswith("weight") else 0.2 * noise


def write_image_reward(out_dir: Path, seed: int) -> Path:
    from fastvideo.rewards.aesthetic import AestheticMLP
    from fastvideo.rewards.imagereward import build_text, build_vision, vision_key

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = write_vocab(out_dir) + 2  # + BLIP's [DEC] and [ENC]
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, **TINY_MED, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
           "model_type": "bert", "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": vocab_size,
           "encoder_width": TINY_VIT["width"], "add_cross_attention": True}
    (out_dir / "med_config.json").write_text(json.dumps(med, indent=2) + "\n")
    v, grid = TINY_VIT, TINY_VIT["image_size"] // TINY_VIT["patch"]
    shapes = {"embeddings.class_embedding": torch.zeros(1, 1, v["width"]),
              "embeddings.patch_embedding.weight": torch.zeros(v["width"], 3, v["patch"], v["patch"]),
              "embeddings.position_embedding": torch.zeros(1, grid * grid + 1, v["width"]),
              **{f"encoder.layers.{i}.mlp.fc1.weight": torch.zeros(v["mlp"], v["width"]) for i in range(v["depth"])}}
    generator = torch.Generator().manual_seed(seed + 20)
    vision = build_vision(shapes)
    text = build_text(out_dir / "med_config.json", v["width"])
    mlp = AestheticMLP(TINY_MED["hidden_size"])
    projections = torch.nn.ModuleDict({"vision_proj": torch.nn.Linear(v["width"], 256),
                                       "text_proj": torch.nn.Linear(TINY_MED["hidden_size"], 256)})
    for module in (vision, text, mlp, projections):
        _randomise(module, generator)
    sd = {f"blip.visual_encoder.{vision_key(k, inverse=True)}": t for k, t in vision.state_dict().items()}
    sd.update({f"blip.text_encoder.{k}": t for k, t in text.state_dict().items()})
    # BLIP's BERT embeddings save their position_ids buffer; transformers' do not.
    sd["blip.text_encoder.embeddings.position_ids"] = torch.arange(TINY_MED["max_position_embeddings"]).expand(1, -1)
    sd.update({f"blip.{k}": t for k, t in projections.state_dict().items()})
    sd.update({f"mlp.{k}": t for k, t in mlp.state_dict().items()})
    torch.save({k: t.detach().clone().contiguous() for k, t in sd.items()}, out_dir / "ImageReward.pt")
    return out_dir
