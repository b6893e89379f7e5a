"""A diffusers model from a folder, refused with one line when its config.json and weights disagree.

A folder that mixes two models (the config of one download, the weights of another) fails in the
loader on both library lines, but differently: diffusers 0.32 raises (missing keys, size mismatch);
0.42 raises for a size mismatch but loads a config that needs more weights than the files hold,
leaving those parameters on the meta device ("newly initialized", says its warning), so the run
fails later at ``.to(device)`` with "Cannot copy out of meta tensor". Here both become the same
CheckpointError before the model is used.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo.errors import CheckpointError

# Phrases of diffusers' own refusals (0.32 and 0.42): missing keys, a shape that differs.
_MISMATCH_PHRASES = ("keys are missing", "size mismatch", "Cannot load", "shape")


def mixed_folder_error(folder: str | Path, detail: str) -> CheckpointError:
    return CheckpointError(
        f"{folder}: its config.json and weights disagree ({detail}...); "
        "the folder mixes two models: copy config.json and the weights from one download")


def from_pretrained_checked(model_class, root: str | Path, subfolder: str | None = None,
                            dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """``model_class.from_pretrained(root, subfolder=subfolder, torch_dtype=dtype)`` (on the CPU);
    CheckpointError when the weights lack a parameter the config builds or have another shape.
    Weights the config does not use are left to diffusers (a warning on both lines)."""
    folder = Path(root) / subfolder if subfolder else Path(root)
    try:
        model, info = model_class.from_pretrained(root, subfolder=subfolder, torch_dtype=dtype,
                                                   output_loading_info=True)
    except (ValueError, RuntimeError) as exc:
        text = str(exc)
        if not any(s in text for s in _MISMATCH_PHRASES):
            raise
        raise mixed_folder_error(folder, text.splitlines()[0][:160]) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise mixed_folder_error(folder, f"{len(missing)} parameters of the config are not in the weights, "
                                         f"e.g. {', '.join(missing[:3])}")
    return model
