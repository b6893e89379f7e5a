"""Activation checkpointing of a model's repeated blocks, applied from outside (fastvideo.distributed.fsdp
re-exports these: wrap_model applies them before wrapping)."""

from __future__ import annotations

import functools
from typing import Sequence

import torch
from torch import nn

from fastvideo.distributed.selective import spaced_blocks


def default_block_classes(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The model's repeated blocks when the caller names none: the classes a diffusers / transformers
    model lists in ``_no_split_modules`` (FLUX: its double- and single-stream blocks), in the order
    they are listed. A model family passes its own (ModelFamily.block_classes)."""
    names = list(getattr(model, "_no_split_modules", None) or [])
    found: dict[str, type[nn.Module]] = {}
    for m in model.modules():
        if type(m).__name__ in names:
            found.setdefault(type(m).__name__, type(m))
    return tuple(found[n] for n in names if n in found)


# ---------------------------------------------------------------- activation checkpointing
def _blocks_in_order(model: nn.Module, block_classes: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """Blocks in registration order, which for FLUX is execution order (double, then single)."""
    return [m for m in model.modules() if isinstance(m, block_classes)]


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        # Rollouts run under no_grad: nothing would be saved, so recomputation would be pure waste.
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    run.__fastvideo_checkpointed__ = True
    return run


def is_checkpointed(block: nn.Module) -> bool:
    return bool(getattr(block.forward, "__fastvideo_checkpointed__", False))


def apply_activation_checkpointing(
    model: nn.Module, block_classes: Sequence[type[nn.Module]] | None = None, fraction: float = 1.0
) -> int:
    """Checkpoint ``round(fraction * n)`` blocks spaced evenly (spaced_blocks; non-reentrant).

    The block's ``forward`` is replaced on the instance instead of wrapping the block in another
    module, so parameter names (and with them state dicts and checkpoints) are unchanged. Returns the
    number of blocks checkpointed. Idempotent.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"checkpoint fraction {fraction} must be in [0, 1]")
    classes = tuple(block_classes or default_block_classes(model))
    blocks = _blocks_in_order(model, classes)
    if not blocks:
        raise ValueError(_no_blocks_message(model, classes))
    chosen = [blocks[i] for i in spaced_blocks(len(blocks), fraction)]
    for block in chosen:
        if not is_checkpointed(block):
            block.forward = _checkpointed(block.forward)
    return len(chosen)


def _no_blocks_message(model: nn.Module, classes: tuple[type, ...]) -> str:
    names = ", ".join(c.__name__ for c in classes) or "(none named: no block_classes given and no _no_split_modules)"
    return (
        f"{type(model).__name__} contains no module of class {names}; pass block_classes= the model's "
        "transformer block classes (ModelFamily.block_classes())"
    )
