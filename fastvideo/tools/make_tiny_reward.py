"""Write tiny, randomly initialised reward checkpoints in the real file layouts.

    python -m fastvideo.tools.make_tiny_reward OUT_DIR [--seed N]

writes

    OUT_DIR/hps_ckpt/open_clip_pytorch_model.bin     tiny open_clip CLIP state dict (float32)
    OUT_DIR/hps_ckpt/HPS_v2.1_compressed.pt          {'state_dict': ...} (float16, like the real
                                                     "compressed" file), the "fine-tuned" weights
    OUT_DIR/hps_ckpt/<TINY_HPS_MODEL_NAME>.json      the open_clip model config; HPSv2Reward
                                                     registers it when given that model_name
    OUT_DIR/pickscore/                               CLIPModel + CLIPProcessor (save_pretrained),
                                                     usable for both PickScore and CLIP score
    OUT_DIR/aesthetic/open_clip_pytorch_model.bin    tiny QuickGELU open_clip CLIP (OpenAI key layout)
    OUT_DIR/aesthetic/sac+logos+ava1-l14-linearMSE.pth   the aesthetic MLP (published layout)
    OUT_DIR/aesthetic/<TINY_AESTHETIC_CLIP_NAME>.json     its open_clip config
    OUT_DIR/image_reward/ImageReward.pt              tiny BLIP + MLP state dict, the package's key names
    OUT_DIR/image_reward/med_config.json             its BERT config; vocab.txt etc.: a tiny WordPiece

No download: the CLIP tokenizer is built from a byte-level vocabulary written here (256 byte
symbols, their '</w>' variants, <|startoftext|>, <|endoftext|>; no merges). The same seed gives
the same weights. The open_clip text tower keeps open_clip's real vocabulary size (49408) so the
real BPE tokenizer -- which HPS and hpsv2 both use -- can drive it; that embedding dominates the
roughly 5 MB total.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.tools.tiny_builder import END_TOKEN, START_TOKEN, write_clip_vocab

TINY_HPS_MODEL_NAME = "flux-grpo-tiny-hps"
TINY_HPS_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    # context_length 77 and vocab_size 49408: what the (real) SimpleTokenizer produces.
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 2},
}
# A ViT-B/16-sized open_clip model (open_clip's ViT-B-16 architecture under a name of our own):
# big enough that reward batching and overlap show in benchmarks; the real HPSv2.1 is ViT-H-14.
BASE_HPS_MODEL_NAME = "flux-grpo-bench-hps-b16"
BASE_HPS_CONFIG = {
    "embed_dim": 512,
    "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12},
}
# Widths are multiples of 64 with 64-wide heads: OpenAI's clip.model.build_model (the aesthetic
# parity reference) infers heads as width // 64. The text tower is unused by the aesthetic score;
# a small vocabulary keeps the file small.
TINY_AESTHETIC_CLIP_NAME = "flux-grpo-tiny-aesthetic-clip"
TINY_AESTHETIC_CLIP_CONFIG = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 1000, "width": 64, "heads": 1, "layers": 1},
}
HPS_PRESETS = {"tiny": (TINY_HPS_MODEL_NAME, TINY_HPS_CONFIG), "base": (BASE_HPS_MODEL_NAME, BASE_HPS_CONFIG)}
TINY_CLIP_IMAGE_SIZE = 32


@dataclass(frozen=True)
class TinyRewardPaths:
    hps_ckpt_dir: Path
    hps_model_name: str
    hps_model_config: Path
    pickscore_dir: Path
    aesthetic_dir: Path
    aesthetic_clip_name: str
    image_reward_dir: Path


def register_open_clip_config(out_dir: Path, model_name: str, model_config: dict) -> Path:
    """Write open_clip's model config ``model_name``.json into ``out_dir`` (created) and register it
    with open_clip (unless the same config already is): -> the file."""
    import open_clip

    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / f"{model_name}.json"
    config_path.write_text(json.dumps(model_config, indent=2) + "\n")
    if open_clip.get_model_config(model_name) != model_config:
        open_clip.add_model_config(config_path)
    return config_path


def write_hps(out_dir: Path, seed: int, preset: str = "tiny") -> tuple[Path, Path]:
    """Random open_clip base weights + HPS 'state_dict' (base + seeded perturbation, fp16) for
    the ``preset`` architecture of HPS_PRESETS (model_name HPS_PRESETS[preset][0])."""
    import open_clip

    model_name, model_config = HPS_PRESETS[preset]
    config_path = register_open_clip_config(out_dir, model_name, model_config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.create_model(model_name, pretrained=None, device="cpu")
        base = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        # The "HPS fine-tune": different weights, so tests notice if they were not loaded.
        generator = torch.Generator().manual_seed(seed + 1)
        tuned = {
            k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in base.items()
        }
    torch.save(base, out_dir / "open_clip_pytorch_model.bin")
    hps_state = {k: v.half() if v.is_floating_point() else v for k, v in tuned.items()}
    torch.save({"state_dict": hps_state}, out_dir / "HPS_v2.1_compressed.pt")
    return out_dir, config_path


def write_aesthetic(out_dir: Path, seed: int) -> Path:
    """Tiny open_clip CLIP (QuickGELU, OpenAI key names) + the aesthetic MLP, random weights."""
    import open_clip

    from fastvideo.rewards.aesthetic import AESTHETIC_MLP_FILE, AestheticMLP

    register_open_clip_config(out_dir, TINY_AESTHETIC_CLIP_NAME, TINY_AESTHETIC_CLIP_CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 10)
        clip = open_clip.create_model(TINY_AESTHETIC_CLIP_NAME, pretrained=None, device="cpu")
        mlp = AestheticMLP(TINY_AESTHETIC_CLIP_CONFIG["embed_dim"])
        for p in mlp.parameters():  # random biases too (nn.Linear's are small), so tests see them
            torch.nn.init.normal_(p, std=0.2)
    # OpenAI released CLIP in float16 (clip.model.build_model rounds to it): keep the float32
    # values float16-representable, as the real open_clip copy of those weights is.
    torch.save({k: v.half().float().contiguous() if v.is_floating_point() else v.contiguous()
                for k, v in clip.state_dict().items()}, out_dir / "open_clip_pytorch_model.bin")
    torch.save(mlp.state_dict(), out_dir / AESTHETIC_MLP_FILE)
    return out_dir


def write_pickscore(out_dir: Path, seed: int) -> Path:
    """Tiny CLIPModel + CLIPProcessor with save_pretrained."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor
    from transformers import CLIPTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        write_clip_vocab(Path(tmp))  # byte-level, no merges: every word splits into byte symbols
        # from_pretrained reads vocab.json + merges.txt on both library lines (transformers 5's
        # constructor takes the vocabulary itself, not its file).
        tokenizer = CLIPTokenizerFast.from_pretrained(
            tmp, unk_token=END_TOKEN, bos_token=START_TOKEN, eos_token=END_TOKEN, pad_token=END_TOKEN,
            model_max_length=77,
        )
        vocab_text, merges_text = (Path(tmp, name).read_text(encoding="utf-8") for name in ("vocab.json", "merges.txt"))
    vocab_size = len(tokenizer)
    bos, eos = tokenizer.convert_tokens_to_ids([START_TOKEN, END_TOKEN])
    config = CLIPConfig(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=77, bos_token_id=bos,
            eos_token_id=eos, pad_token_id=eos,
        ),
        vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            image_size=TINY_CLIP_IMAGE_SIZE, patch_size=8,
        ),
        projection_dim=16,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": TINY_CLIP_IMAGE_SIZE},
        crop_size={"height": TINY_CLIP_IMAGE_SIZE, "width": TINY_CLIP_IMAGE_SIZE},
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out_dir)
    _complete_hub_layout(out_dir, image_processor, vocab_text, merges_text)
    return out_dir


def _complete_hub_layout(out_dir: Path, image_processor, vocab_text: str, merges_text: str) -> None:
    """The files of the published PickScore / CLIP folders that transformers 5's processor save
    leaves out (it writes processor_config.json and tokenizer.json only); transformers 4.x writes
    them all, so on the recipe line this adds nothing."""
    if not (out_dir / "preprocessor_config.json").is_file():
        image_processor.save_pretrained(out_dir)
    for name, text in (("vocab.json", vocab_text), ("merges.txt", merges_text)):
        if not (out_dir / name).is_file():
            (out_dir / name).write_text(text)


def make_tiny_reward(out_dir: str | Path, seed: int = 0) -> TinyRewardPaths:
    out_dir = Path(out_dir)
    hps_dir, config_path = write_hps(out_dir / "hps_ckpt", seed)
    pick_dir = write_pickscore(out_dir / "pickscore", seed)
    aesthetic_dir = write_aesthetic(out_dir / "aesthetic", seed)
    from fastvideo.tools.make_tiny_image_reward import write_image_reward

    image_reward_dir = write_image_reward(out_dir / "image_reward", seed)
    return TinyRewardPaths(hps_dir, TINY_HPS_MODEL_NAME, config_path, pick_dir,
                           aesthetic_dir, TINY_AESTHETIC_CLIP_NAME, image_reward_dir)


def main(argv: list[str] | None = None) -> TinyRewardPaths:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to write hps_ckpt/ and pickscore/ into")
    parser.add_argument("--seed", type=int, default=0, help="same seed -> same weights")
    args = parser.parse_args(argv)
    paths = make_tiny_reward(args.out_dir, args.seed)
    print(f"HPS:       {paths.hps_ckpt_dir} (model_name={paths.hps_model_name})")
    print(f"PickScore: {paths.pickscore_dir}")
    print(f"Aesthetic: {paths.aesthetic_dir} (clip_model_name={paths.aesthetic_clip_name})")
    print(f"ImageReward: {paths.image_reward_dir}")
    return paths


if __name__ == "__main__":
    main()
