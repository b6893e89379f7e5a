"""HPSv2.1 reward (Human Preference Score v2.1) computed with open_clip_torch.

The hpsv2 package is not needed: its scorer is an open_clip CLIP model whose weights are the
``state_dict`` entry of ``HPS_v2.1_compressed.pt``. We reproduce its scoring path exactly
(checked against the package in tests/rewards/test_reward_hps_parity.py):

1. build the open_clip architecture (``ViT-H-14``) without downloading anything;
2. load ``open_clip_pytorch_model.bin`` (the LAION CLIP weights upstream starts from), then the
   ``state_dict`` of ``HPS_v2.1_compressed.pt``, both with ``torch.load(weights_only=True)``;
3. preprocess with HPS's own validation transform (resize the LONGER side to the model's image
   size with antialiased bicubic, pad to a square with black, OpenAI CLIP mean/std) -- not
   open_clip's default shorter-side resize + centre crop;
4. score = <normalised image features, normalised text features>, no logit scale
   (upstream takes the diagonal of image_features @ text_features.T).

Scores of real HPSv2.1 on good images are around 0.25-0.35.

Input precision (``input_precision`` / ``--hps_input``): "uint8" (default) is upstream's path --
DanceGRPO turns each decoded image into an 8-bit PIL image (diffusers' postprocess: round(255 x))
and scores it through HPS's ``preprocess_val`` (ToTensor, i.e. value / 255, then the resize
below) with the similarity ``image_features @ text_features.T`` under the reward autocast (fp16
on GPU/NPU, as upstream's autocast on its accelerator; float32 on CPU, where the device layer
runs no autocast). Float images are rounded to 8 bits first, so a tensor and the same images as
8-bit PIL score the same. "float" skips the rounding and takes the row-wise dot product in
float32 (for alignment work: it differs from upstream by ~1e-4 per image).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from fastvideo.rewards.base import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    BatchedReward,
    CheckpointError,
    ImageBatch,
    as_tensor_list,
    load_state_dict_strict,
    load_weights_only,
    strip_module_prefix,
)
from fastvideo.errors import MissingInputError
from fastvideo.rewards.weights import default_folder, where_to_get

HPS_CHECKPOINT = "HPS_v2.1_compressed.pt"
OPEN_CLIP_CHECKPOINT = "open_clip_pytorch_model.bin"
DEFAULT_HPS_CKPT_DIR = default_folder("hpsv2")  # upstream's hard-coded folder (fastvideo/rewards/weights.py)
DEFAULT_MODEL_NAME = "ViT-H-14"


def resolve_hps_files(
    hps_ckpt_dir: str | Path, checkpoint_name: str = HPS_CHECKPOINT
) -> tuple[Path, Path]:
    """(open_clip_pytorch_model.bin, HPS checkpoint) inside hps_ckpt_dir, or a clear error."""
    folder = Path(hps_ckpt_dir)
    expected = [OPEN_CLIP_CHECKPOINT, checkpoint_name]
    if not folder.is_dir():
        raise MissingInputError(
            f"HPS checkpoint folder {str(folder)!r} does not exist. It must hold "
            f"{' and '.join(expected)}: {where_to_get('hpsv2', str(folder))}."
        )
    missing = [n for n in expected if not (folder / n).is_file()]
    if missing:
        raise MissingInputError(
            f"HPS checkpoint folder {str(folder)!r} lacks {', '.join(missing)}: "
            f"{where_to_get('hpsv2', str(folder))}."
        )
    return folder / OPEN_CLIP_CHECKPOINT, folder / checkpoint_name


def ensure_open_clip_config(
    model_name: str, model_config: str | Path | None = None, search_dir: str | Path | None = None
) -> None:
    """Make ``model_name`` buildable by open_clip.

    Built-in names (ViT-H-14) need nothing. Otherwise the config JSON is registered with
    open_clip.add_model_config: ``model_config`` if given (its file stem must be model_name),
    else ``<search_dir>/<model_name>.json`` (where make_tiny_reward writes its tiny config).
    """
    import open_clip  # core dependency, imported lazily (heavy)

    path = Path(model_config) if model_config is not None else None
    if path is None and model_name in open_clip.list_models():
        return
    local = Path(search_dir) / f"{model_name}.json" if search_dir is not None else None
    if path is None and local is not None and local.is_file():
        path = local
    if path is None:
        raise ValueError(
            f"open_clip has no model config named {model_name!r} and no {model_name}.json was "
            f"found in {str(search_dir)!r}; pass model_config=<path to {model_name}.json> or use "
            f"{DEFAULT_MODEL_NAME!r}"
        )
    if not path.is_file():
        raise MissingInputError(f"open_clip model config {str(path)!r} does not exist")
    if path.stem != model_name:
        raise ValueError(
            f"open_clip names a config after its file: {path.name} registers {path.stem!r}, "
            f"not model_name={model_name!r}"
        )
    cfg = json.loads(path.read_text())
    if open_clip.get_model_config(model_name) != cfg:
        open_clip.add_model_config(path)


def _open_clip_shapes(model_name: str) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of an open_clip architecture, built on the meta device (no memory, ~0.4 s)."""
    import open_clip

    with _without_log_records("No pretrained weights loaded"), torch.device("meta"):
        model = open_clip.create_model(model_name, pretrained=None, precision="fp32", device="meta")
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _named_configs(folder: Path) -> list[str]:
    """Architectures a folder names: ``<name>.json`` open_clip configs beside the weights."""
    names = []
    for path in sorted(folder.glob("*.json")):
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict) and {"vision_cfg", "text_cfg"} <= set(cfg):
            names.append(path.stem)
    return names


def check_hps_architecture(hps_ckpt_dir: str | Path, model_name: str = DEFAULT_MODEL_NAME) -> None:
    """Pre-flight: the HPS checkpoint's tensors have the shapes of ``model_name``'s architecture
    (read through a memory map: no weights are loaded). A mismatch is one CheckpointError naming the
    first differing tensors and, where the folder holds the config of an architecture that fits,
    its name for --hps_model_name."""
    _, hps_checkpoint = resolve_hps_files(hps_ckpt_dir)
    ensure_open_clip_config(model_name, search_dir=hps_ckpt_dir)
    ckpt = load_weights_only(hps_checkpoint, mmap=True)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        return  # load_hps_model names this case with its fix
    found = {k: tuple(v.shape) for k, v in strip_module_prefix(ckpt["state_dict"]).items() if hasattr(v, "shape")}
    if _shape_mismatches(found, _open_clip_shapes(model_name)) == []:
        return
    fits = []
    for name in _named_configs(Path(hps_ckpt_dir)):
        if name != model_name:
            ensure_open_clip_config(name, search_dir=hps_ckpt_dir)
            if not _shape_mismatches(found, _open_clip_shapes(name)):
                fits.append(name)
    hint = (f"; the folder's {fits[0]}.json fits it: pass --hps_model_name {fits[0]}" if fits else
            "; pass the --hps_model_name of the architecture it was trained with (ViT-H-14 for HPSv2.1)")
    first = ", ".join(_shape_mismatches(found, _open_clip_shapes(model_name))[:3])
    raise CheckpointError(f"{hps_checkpoint} does not fit the {model_name!r} architecture ({first}){hint}")


def _shape_mismatches(found: dict, expected: dict) -> list[str]:
    """'name: found vs expected' for every tensor whose shape differs or is missing on one side."""
    out = [f"{k}: {found[k]} vs {expected[k]}" for k in expected if k in found and found[k] != expected[k]]
    out += [f"{k}: missing" for k in expected if k not in found]
    out += [f"{k}: unexpected" for k in found if k not in expected]
    return out


@contextlib.contextmanager
def _without_log_records(prefix: str) -> Iterator[None]:
    """Drop root-logger records starting with prefix (open_clip logs through the root logger)."""

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(prefix)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def load_hps_model(
    model_name: str, open_clip_bin: Path, hps_checkpoint: Path
) -> torch.nn.Module:
    """open_clip model with the LAION weights, then the HPS weights on top; eval, CPU, fp32."""
    import open_clip

    # pretrained=None: build the architecture only; never reach for the hub. open_clip then
    # warns "initialized randomly", which is untrue a few lines below: silence that one record.
    with _without_log_records("No pretrained weights loaded"):
        model = open_clip.create_model(model_name, pretrained=None, precision="fp32", device="cpu")

    base = load_weights_only(open_clip_bin)
    if isinstance(base, dict) and isinstance(base.get("state_dict"), dict):
        base = base["state_dict"]
    if not isinstance(base, dict):
        raise CheckpointError(
            f"{open_clip_bin} should hold a state dict; got {type(base).__name__}"
        )
    base = strip_module_prefix(base)
    if "logit_scale" in base and base["logit_scale"].ndim != model.logit_scale.ndim:
        base["logit_scale"] = base["logit_scale"].reshape(model.logit_scale.shape)
    load_state_dict_strict(model, base, str(open_clip_bin))

    ckpt = load_weights_only(hps_checkpoint)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        keys = sorted(ckpt)[:10] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(
            f"{hps_checkpoint} has no 'state_dict' entry (found: {keys}). HPS checkpoints store "
            f"the scorer under 'state_dict': {where_to_get('hpsv2', str(hps_checkpoint.parent))}."
        )
    load_state_dict_strict(model, strip_module_prefix(ckpt["state_dict"]), str(hps_checkpoint))
    return model.eval().requires_grad_(False)


INPUT_PRECISIONS = ("uint8", "float")


def quantize_8bit(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` in [0, 1] -> the same images after an 8-bit round trip, float32 on CPU:
    round(255 x) / 255 as diffusers' numpy_to_pil then ToTensor (uint8 / 255) compute it."""
    x = images.detach().float().cpu().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)
    return x.float().div(255.0)


def hps_preprocess(images: torch.Tensor, image_size: int) -> torch.Tensor:
    """HPS validation transform: ``[B, 3, H, W]`` in [0, 1] -> normalised ``[B, 3, S, S]``.

    Matches hpsv2's ResizeMaxSize + MaskAwareNormalize: scale so the longer side is S (bicubic,
    antialiased, sizes rounded with Python's round), pad with zeros split left/right and
    top/bottom as (pad // 2, pad - pad // 2), then OpenAI CLIP mean/std. hpsv2 skips the pad when
    the longer side already equals S, which crashes on non-square images; we always pad.
    """
    _, _, h, w = images.shape
    scale = image_size / float(max(h, w))
    if scale != 1.0:
        h, w = max(1, round(h * scale)), max(1, round(w * scale))
        images = F.interpolate(
            images, size=(h, w), mode="bicubic", align_corners=False, antialias=True
        )
    pad_h, pad_w = image_size - h, image_size - w
    images = F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    mean = images.new_tensor(OPENAI_CLIP_MEAN).view(1, 3, 1, 1)
    std = images.new_tensor(OPENAI_CLIP_STD).view(1, 3, 1, 1)
    return (images - mean) / std


class HPSv2Reward(BatchedReward):
    """HPSv2.1 score per (image, its own prompt); float32 ``[B]`` on CPU.

    Args:
        hps_ckpt_dir: folder with open_clip_pytorch_model.bin and HPS_v2.1_compressed.pt.
        model_name: open_clip architecture; tests pass the tiny one from make_tiny_reward.
        model_config: optional JSON config registered under model_name (otherwise
            ``<hps_ckpt_dir>/<model_name>.json`` is used when model_name is not built in).
        checkpoint_name: HPS file inside hps_ckpt_dir (HPS_v2_compressed.pt for HPSv2.0).
        input_precision: "uint8" (upstream's 8-bit images, default) or "float" (see the module doc).
        device, dtype, batch_size: see BatchedReward.
    """

    name = "hpsv2"

    def __init__(
        self,
        hps_ckpt_dir: str | Path = DEFAULT_HPS_CKPT_DIR,
        model_name: str = DEFAULT_MODEL_NAME,
        model_config: str | Path | None = None,
        checkpoint_name: str = HPS_CHECKPOINT,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 8,
        input_precision: str = "uint8",
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        import open_clip

        if input_precision not in INPUT_PRECISIONS:
            raise ValueError(f"input_precision must be one of {INPUT_PRECISIONS}, not {input_precision!r}")
        self.input_precision = input_precision

        open_clip_bin, hps_file = resolve_hps_files(hps_ckpt_dir, checkpoint_name)
        ensure_open_clip_config(model_name, model_config, search_dir=hps_ckpt_dir)
        self.model = load_hps_model(model_name, open_clip_bin, hps_file).to(self.device)
        size = self.model.visual.image_size
        size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        if size[0] != size[1]:
            raise ValueError(f"HPS needs a square model image size; {model_name} has {size}")
        self.image_size = int(size[0])
        # SimpleTokenizer with the model's context length (77), the same BPE as hpsv2's.
        self.tokenizer = open_clip.get_tokenizer(model_name)

    def preprocess(self, images: ImageBatch) -> torch.Tensor:
        """Either input form -> ``[b, 3, S, S]`` on CPU in float32.

        Done on CPU so every device sees bit-identical pixels (and antialiased bicubic is not
        implemented on every accelerator)."""
        if isinstance(images, torch.Tensor):
            if self.input_precision == "uint8":
                return hps_preprocess(quantize_8bit(images), self.image_size)
            return hps_preprocess(images.detach().float().cpu(), self.image_size)
        return torch.cat(
            [hps_preprocess(x.unsqueeze(0), self.image_size) for x in as_tensor_list(images)]
        )

    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        pixels = self.preprocess(images).to(self.device)
        tokens = self.tokenizer(list(prompts)).to(self.device)
        with self.autocast():
            image_features = self.model.encode_image(pixels, normalize=True)
            text_features = self.model.encode_text(tokens, normalize=True)
            if self.input_precision == "uint8":  # upstream: the similarity under the autocast
                return torch.diagonal(image_features @ text_features.T).float()
        # Row-wise dot product == diagonal of image_features @ text_features.T, in float32.
        return (image_features.float() * text_features.float()).sum(dim=-1)
