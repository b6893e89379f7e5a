"""LAION aesthetic predictor ("improved aesthetic predictor", v2) with open_clip.

The published predictor scores an image in three steps, reproduced here (checked against the
published computation in tests/rewards/test_reward_aesthetic_parity.py):

1. CLIP ViT-L/14 (OpenAI weights) image embedding, with CLIP's own preprocessing of a PIL image:
   resize the shorter side to 224 (bicubic), centre crop 224, OpenAI mean/std;
2. L2-normalise the embedding (a zero vector is left as is);
3. a five-layer MLP *without* activations (768 -> 1024 -> 128 -> 64 -> 16 -> 1, dropout between
   the first four, inactive at eval), weights ``sac+logos+ava1-l14-linearMSE.pth``.

Scores are on the AVA scale, roughly 1-10 (about 5-6.5 for decent images). The prompt is not used.

Files in ``aesthetic_dir``: the MLP checkpoint above and the CLIP ViT-L/14 OpenAI weights in
open_clip's layout (``open_clip_pytorch_model.bin`` or ``open_clip_model.safetensors``), e.g.
from the hub repository timm/vit_large_patch14_clip_224.openai. OpenAI's own ``ViT-L-14.pt`` is a
TorchScript archive and cannot be loaded weights-only; use the open_clip copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fastvideo.rewards.base import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, BatchedReward, CheckpointError, ImageBatch
from fastvideo.rewards.base import as_pils, load_state_dict_strict, load_weights_only, strip_module_prefix
from fastvideo.rewards.hps import _without_log_records, ensure_open_clip_config
from fastvideo.rewards.weights import default_folder, where_to_get

DEFAULT_AESTHETIC_DIR = default_folder("aesthetic")
AESTHETIC_MLP_FILE = "sac+logos+ava1-l14-linearMSE.pth"
CLIP_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# OpenAI's ViT-L/14 uses QuickGELU; open_clip names that variant explicitly.
DEFAULT_CLIP_MODEL = "ViT-L-14-quickgelu"
# The published MLP's hidden sizes; its input size is the CLIP embedding size (768 for ViT-L/14).
MLP_HIDDEN = (1024, 128, 64, 16)
MLP_DROPOUT = (0.2, 0.2, 0.1)


def aesthetic_mlp(input_size: int) -> nn.Sequential:
    """The published layout, module indices included (the checkpoint's keys are layers.0,
    layers.2, layers.4, layers.6, layers.7): Linear, Dropout, Linear, Dropout, Linear, Dropout,
    Linear, Linear. No activations: the predictor is linear in the normalised embedding."""
    a, b, c, d = MLP_HIDDEN
    p1, p2, p3 = MLP_DROPOUT
    return nn.Sequential(
        nn.Linear(input_size, a), nn.Dropout(p1), nn.Linear(a, b), nn.Dropout(p2),
        nn.Linear(b, c), nn.Dropout(p3), nn.Linear(c, d), nn.Linear(d, 1),
    )


class AestheticMLP(nn.Module):
    """Holds the Sequential under ``layers`` so the published state dict loads as is."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.layers = aesthetic_mlp(input_size)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """[B, D] normalised embeddings -> [B] scores."""
        return self.layers(embeddings).squeeze(-1)


def resolve_aesthetic_files(folder: str | Path, mlp_file: str = AESTHETIC_MLP_FILE) -> tuple[Path, Path]:
    """(CLIP weights, MLP checkpoint) inside folder, or an error naming what to download."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"aesthetic checkpoint folder {str(folder)!r} does not exist; it must hold "
            f"{mlp_file} and {' or '.join(CLIP_FILES)}: {where_to_get('aesthetic', str(folder))}."
        )
    clip = next((folder / n for n in CLIP_FILES if (folder / n).is_file()), None)
    missing = [n for n, ok in ((mlp_file, (folder / mlp_file).is_file()),
                               (" or ".join(CLIP_FILES), clip is not None)) if not ok]
    if missing:
        raise FileNotFoundError(
            f"aesthetic checkpoint folder {str(folder)!r} lacks {', '.join(missing)}: "
            f"{where_to_get('aesthetic', str(folder))}."
        )
    return clip, folder / mlp_file


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """A plain state dict from .safetensors or a weights-only torch file ('state_dict' unwrapped)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    sd = load_weights_only(path)
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path} should hold a state dict; got {type(sd).__name__}")
    return strip_module_prefix(sd)


def load_open_clip(model_name: str, weights: Path) -> nn.Module:
    """open_clip architecture ``model_name`` with ``weights`` loaded strictly; eval, fp32, CPU."""
    import open_clip

    with _without_log_records("No pretrained weights loaded"):
        model = open_clip.create_model(model_name, pretrained=None, precision="fp32", device="cpu")
    sd = load_state_dict_file(weights)
    for key in ("input_resolution", "context_length", "vocab_size"):  # OpenAI-format extras
        sd.pop(key, None)
    if "logit_scale" in sd and sd["logit_scale"].ndim != model.logit_scale.ndim:
        sd["logit_scale"] = sd["logit_scale"].reshape(model.logit_scale.shape)
    load_state_dict_strict(model, {k: v.float() for k, v in sd.items()}, str(weights))
    return model.eval().requires_grad_(False)


def clip_preprocess(image_size: int):
    """CLIP's eval transform on PIL images (shorter side -> S bicubic, centre crop, mean/std)."""
    from torchvision import transforms as T

    return T.Compose([
        T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC),
        T.CenterCrop(image_size),
        T.ToTensor(),
        T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
    ])


class AestheticReward(BatchedReward):
    """LAION aesthetic score per image (the prompt is ignored); float32 ``[B]`` on CPU.

    Args:
        aesthetic_dir: folder with the MLP checkpoint and the CLIP weights (see module doc).
        clip_model_name: open_clip architecture of the CLIP weights; tests pass a tiny one.
        model_config: optional open_clip JSON config for clip_model_name (otherwise
            ``<aesthetic_dir>/<clip_model_name>.json`` when the name is not built in).
        mlp_file: MLP checkpoint name inside aesthetic_dir.
        device, dtype, batch_size: see BatchedReward.
    """

    name = "aesthetic"

    def __init__(
        self,
        aesthetic_dir: str | Path = DEFAULT_AESTHETIC_DIR,
        clip_model_name: str = DEFAULT_CLIP_MODEL,
        model_config: str | Path | None = None,
        mlp_file: str = AESTHETIC_MLP_FILE,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 8,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        clip_file, mlp_path = resolve_aesthetic_files(aesthetic_dir, mlp_file)
        ensure_open_clip_config(clip_model_name, model_config, search_dir=aesthetic_dir)
        self.clip = load_open_clip(clip_model_name, clip_file).to(self.device)
        self.mlp = AestheticMLP(int(self.clip.visual.output_dim))
        load_state_dict_strict(self.mlp, load_state_dict_file(mlp_path), str(mlp_path))
        self.mlp = self.mlp.float().eval().requires_grad_(False).to(self.device)
        size = self.clip.visual.image_size
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)
        self.transform = clip_preprocess(self.image_size)

    def embed(self, images: ImageBatch) -> torch.Tensor:
        """[b] images -> [b, D] L2-normalised CLIP image embeddings (float32)."""
        pixels = torch.stack([self.transform(im) for im in as_pils(images)]).to(self.device)
        with self.autocast():
            features = self.clip.encode_image(pixels)
        return F.normalize(features.float(), dim=-1)

    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        return self.mlp(self.embed(images))  # the MLP runs in float32, as published
