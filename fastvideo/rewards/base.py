"""The reward protocol, image conversions and weights-only checkpoint loading.

A reward is called as ``reward(images, prompts) -> torch.FloatTensor[B]`` (float32, on CPU):

- ``images``: a list of B PIL images (any sizes), or a float tensor ``[B, 3, H, W]`` in [0, 1]
  on any device (what the VAE decode gives after ``(x / 2 + 0.5).clamp(0, 1)``).
- ``prompts``: a list of B strings; image i is scored against prompt i.
- ``sources`` (keyword, editing only): the B source images the samples were edited from, a float
  tensor ``[B, 3, H', W']`` in [0, 1], given only to a reward whose class sets ``uses_sources =
  True`` (``takes_sources``); None for a text-to-image model. Rewards that ignore it never see it.

Rewards are built by name with ``fastvideo.rewards.registry.build_reward`` (the built-in names and
plugins). The model-backed ones import their heavy dependencies only when built, so importing this
package costs nothing.
"""

from __future__ import annotations

import abc
import pickle
import zipfile
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Protocol, Union, runtime_checkable

import numpy as np
import torch
from PIL import Image

from fastvideo import devices
from fastvideo.errors import CheckpointError, MissingInputError, UserError

ImageBatch = Union[Sequence[Image.Image], torch.Tensor]

# OpenAI CLIP normalisation, used by HPS (open_clip's OPENAI_DATASET_MEAN / _STD) and by the
# CLIP / PickScore image processors.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@runtime_checkable
class Reward(Protocol):
    """Anything called as ``reward(images, prompts) -> FloatTensor[B]`` (float32, CPU)."""

    name: str

    def __call__(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor: ...


def takes_sources(reward) -> bool:
    """Whether ``reward`` is called with ``sources=`` (its class says so with ``uses_sources = True``)."""
    return bool(getattr(reward, "uses_sources", False))


def needs_sources(reward) -> bool:
    """Whether ``reward`` (an instance or a class) cannot score without source images: it takes
    them and does not say ``sources_optional = True`` (a VLM judge shows them when there are some)."""
    return takes_sources(reward) and not getattr(reward, "sources_optional", False)


def check_sources(sources, n: int, name: str) -> None:
    """The source images of a call of ``n`` samples: a float tensor [n, 3, H, W] in [0, 1]."""
    if sources is None:
        raise RewardInputError(f"the {name} reward compares each image with its source image, and none was given: "
                               "train an editing model family (--model_family kontext) on a prompt file with images")
    if not isinstance(sources, torch.Tensor) or _check_tensor_images(sources) != n:
        raise RewardInputError(f"the {name} reward needs {n} source images as one [B, 3, H, W] tensor; got "
                               f"{type(sources).__name__} {list(getattr(sources, 'shape', []))}")


class RewardInputError(UserError, ValueError):
    """Images or prompts given to a reward have the wrong type, shape or range."""


class UnknownRewardError(UserError, ValueError):
    """A reward name that is not in the registry."""


# ---------------------------------------------------------------------------------------------
# Input checks and conversions
# ---------------------------------------------------------------------------------------------


def check_inputs(images: ImageBatch, prompts: Sequence[str]) -> int:
    """Validate a reward call and return the batch size B.

    Tensors must be floating ``[B, 3, H, W]`` with finite values in [0, 1]; lists must hold PIL
    images; prompts must be a list of B strings.
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise RewardInputError(
            f"prompts must be a list of strings, one per image; got {type(prompts).__name__}"
        )
    bad = [type(p).__name__ for p in prompts if not isinstance(p, str)]
    if bad:
        raise RewardInputError(f"prompts must all be str; got {sorted(set(bad))}")
    if isinstance(images, torch.Tensor):
        n = _check_tensor_images(images)
    elif isinstance(images, Sequence) and not isinstance(images, (str, bytes)):
        bad = [type(im).__name__ for im in images if not isinstance(im, Image.Image)]
        if bad:
            raise RewardInputError(
                f"an image list must hold PIL.Image.Image objects; got {sorted(set(bad))}. "
                "Pass tensors as one [B, 3, H, W] float tensor in [0, 1] instead."
            )
        n = len(images)
    else:
        raise RewardInputError(
            "images must be a list of PIL images or a float tensor [B, 3, H, W] in [0, 1]; "
            f"got {type(images).__name__}"
        )
    if n == 0:
        raise RewardInputError("empty batch: a reward needs at least one image")
    if n != len(prompts):
        raise RewardInputError(f"{n} images but {len(prompts)} prompts; give one prompt per image")
    return n


def _check_tensor_images(images: torch.Tensor) -> int:
    shape = tuple(images.shape)
    if images.ndim != 4 or shape[1] != 3:
        hint = ""
        if images.ndim == 3:
            hint = " (a single image? add the batch dimension with images.unsqueeze(0))"
        elif images.ndim == 4 and shape[-1] == 3:
            hint = " (channels-last? use images.permute(0, 3, 1, 2))"
        raise RewardInputError(f"image tensor must be [B, 3, H, W]; got {list(shape)}{hint}")
    if shape[0] == 0:
        return 0
    if shape[2] == 0 or shape[3] == 0:
        raise RewardInputError(f"image tensor has an empty spatial size: {list(shape)}")
    if not images.is_floating_point():
        raise RewardInputError(
            f"image tensor must be floating point in [0, 1]; got {images.dtype} "
            "(for uint8 images use images.float() / 255)"
        )
    lo, hi = float(images.min()), float(images.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise RewardInputError("image tensor contains NaN or Inf")
    if lo < 0.0 or hi > 1.0:
        raise RewardInputError(
            f"image tensor values must lie in [0, 1]; got [{lo:.4g}, {hi:.4g}] "
            "(VAE output in [-1, 1]? use (x / 2 + 0.5).clamp(0, 1))"
        )
    return shape[0]


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """One PIL image -> float32 ``[3, H, W]`` in [0, 1] (RGB, value / 255, like ToTensor)."""
    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)


def pils_to_tensor(images: Sequence[Image.Image]) -> torch.Tensor:
    """Same-size PIL images -> float32 ``[B, 3, H, W]`` in [0, 1]."""
    sizes = {im.size for im in images}
    if len(sizes) != 1:
        raise RewardInputError(f"images must share one size to stack; got sizes {sorted(sizes)}")
    return torch.stack([pil_to_tensor(im) for im in images])


def tensor_to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[B, 3, H, W]`` in [0, 1] -> uint8 ``[B, H, W, 3]``, rounded as diffusers' numpy_to_pil."""
    x = images.detach().float().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def tensor_to_pils(images: torch.Tensor) -> list[Image.Image]:
    """``[B, 3, H, W]`` in [0, 1] -> B RGB PIL images (8-bit, as saved PNGs would be)."""
    return [Image.fromarray(a, mode="RGB") for a in tensor_to_uint8(images)]


def as_pils(images: ImageBatch) -> list[Image.Image]:
    """Either input form -> list of RGB PIL images."""
    if isinstance(images, torch.Tensor):
        return tensor_to_pils(images)
    return [im if im.mode == "RGB" else im.convert("RGB") for im in images]


def as_tensor_list(images: ImageBatch) -> list[torch.Tensor]:
    """Either input form -> list of float ``[3, H, W]`` in [0, 1] (sizes may differ for lists)."""
    if isinstance(images, torch.Tensor):
        return list(images.float().unbind(0))
    return [pil_to_tensor(im) for im in images]


# ---------------------------------------------------------------------------------------------
# Weights-only checkpoint loading
# ---------------------------------------------------------------------------------------------


def load_weights_only(path: str | Path, mmap: bool = False) -> Any:
    """torch.load with ``weights_only=True`` to CPU; a checkpoint that needs arbitrary pickled
    objects is refused (loading it could run code) with an error saying how to fix it. ``mmap``:
    map the file instead of reading it (for a look at shapes; legacy non-zip files are read)."""
    path = Path(path)
    try:
        if mmap and zipfile.is_zipfile(path):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" not in str(exc).lower():  # no refused class (GLOBAL opcode): the bytes are no torch file
            raise CheckpointError(
                f"{path} is not a readable torch checkpoint (torch.load could not parse it); it may be "
                "truncated or another kind of file: download it again"
            ) from exc
        raise CheckpointError(
            f"refusing to load {path}: it contains pickled Python objects, not only tensors "
            f"(torch.load(weights_only=True) said: {str(exc).splitlines()[0]}). Re-save it from a "
            "trusted environment as plain tensors, e.g. torch.save({'state_dict': "
            "{k: v for k, v in sd.items()}}, path)."
        ) from exc
    except FileNotFoundError as exc:
        raise MissingInputError(f"{path} does not exist") from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(
            f"{path} is not a readable torch checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "it may be truncated or another kind of file: download it again"
        ) from exc


def strip_module_prefix(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the 'module.' prefix that DataParallel / DDP checkpoints carry."""
    if state_dict and all(k.startswith("module.") for k in state_dict):
        return {k[len("module."):]: v for k, v in state_dict.items()}
    return state_dict


def load_state_dict_strict(model: torch.nn.Module, state_dict: dict, source: str) -> None:
    """load_state_dict(strict=True) with an error that names the file and a few bad keys."""
    result = model.load_state_dict(state_dict, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{source} does not match the model: {len(result.missing_keys)} missing keys "
            f"{result.missing_keys[:5]}, {len(result.unexpected_keys)} unexpected keys "
            f"{result.unexpected_keys[:5]}. Is it the checkpoint for this model name/config?"
        )


# ---------------------------------------------------------------------------------------------
# Batched base class
# ---------------------------------------------------------------------------------------------


class BatchedReward(abc.ABC):
    """Validates inputs, splits them into chunks of ``batch_size`` and concatenates the scores.

    Subclasses implement :meth:`_score` for one chunk. Model rewards run on ``device`` under
    ``devices.autocast(device, dtype)`` (float32: no autocast). ``dtype=None`` picks what upstream
    DanceGRPO and the Ascend recipe score with: float16 autocast on an accelerator (torch.amp's
    GPU and NPU autocast default to float16), float32 on the CPU (exact, reproducible).
    """

    name: str = "reward"
    # True: _score also takes the chunk's source images (sources=, [b, 3, H, W] in [0, 1]).
    uses_sources: bool = False

    def __init__(
        self,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 8,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.batch_size = batch_size

    @property
    def compute_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        return torch.float16 if devices.is_accelerator(self.device) else torch.float32

    def autocast(self):
        return devices.autocast(self.device, self.compute_dtype)

    @abc.abstractmethod
    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        """Scores ``[b]`` for one validated chunk of at most batch_size samples."""

    def __call__(self, images: ImageBatch, prompts: Sequence[str], sources: torch.Tensor | None = None) -> torch.Tensor:
        n = check_inputs(images, prompts)
        prompts = list(prompts)
        if self.uses_sources:
            check_sources(sources, n, self.name)
        out = []
        with torch.no_grad():
            for start in range(0, n, self.batch_size):
                stop = min(start + self.batch_size, n)
                extra = {"sources": sources[start:stop]} if self.uses_sources else {}
                scores = self._score(images[start:stop], prompts[start:stop], **extra)
                out.append(scores.detach().float().reshape(-1).cpu())
        result = torch.cat(out)
        if result.shape != (n,):
            raise RuntimeError(f"{self.name} returned {list(result.shape)} scores for {n} images")
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, batch_size={self.batch_size})"
