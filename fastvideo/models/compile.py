"""Regional compilation (--compile): each repeated block of a transformer compiled on its own.

    compile_blocks(model, family.block_classes(), devices.compile_backend(device))

A model family names its repeated blocks (``ModelFamily.block_classes``: FLUX's double- and
single-stream blocks); every block of those classes is compiled in place with ``fullgraph=True``,
so a graph break is an error at the first call instead of a silent slow path. The blocks of one
class share their code and, with torch's inlined module tracing (the default since torch 2.5),
take their weights as graph inputs: one compiled graph per class (and per grad mode / input shape
and strides) serves all 57 FLUX blocks, so compile time does not grow with depth. (diffusers 0.42's
single-stream block returns its text and image tokens as slices of one tensor, so that class gets a
second graph for the blocks after the first.) The embedders, the output
projection and everything between blocks stay eager.

Works under any wrapping (applied after wrap_model): an FSDP unit gathers the flat parameter and
calls its block, a checkpointed block's forward (distributed/checkpointing.py) recomputes through
torch.utils.checkpoint, which torch's compiler traces. The backend comes from the device layer
(devices.compile_backend): inductor on CUDA and CPU, TorchAir on NPU.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from torch import nn

# Shapes that change between calls (rollout batch vs micro-batch, the last partial chunk) each
# cost a compile until torch marks the dimension dynamic; a run sees a handful per block class.
# torch's default limit is 8 per code object, and every block class shares nn.Module's call code.
RECOMPILE_LIMIT = 32


def compile_blocks(model: nn.Module, block_classes: Sequence[type[nn.Module]], backend,
                   fullgraph: bool = True) -> dict[str, int]:
    """Compile every module of ``block_classes`` inside ``model`` (wrapped or not) in place;
    returns {block class name: blocks compiled}. ValueError when the model has none of them."""
    classes = tuple(block_classes)
    counts: Counter[str] = Counter()
    for module in model.modules():
        if not isinstance(module, classes):
            continue
        if not _compiled(module):  # idempotent: a second call keeps the first compilation
            _trace_as_plain_module(module)
            module.compile(backend=backend, fullgraph=fullgraph)
        counts[type(module).__name__] += 1
    if not counts:
        names = ", ".join(c.__name__ for c in classes) or "(none)"
        raise ValueError(f"--compile: {type(model).__name__} contains no block of class {names}; the model "
                         "family's block_classes() must name the transformer's repeated blocks")
    _raise_recompile_limit(RECOMPILE_LIMIT)
    return dict(counts)


def _trace_as_plain_module(block: nn.Module) -> None:
    """Let torch's compiler trace a block that an FSDP1 unit with flat parameters manages.

    FSDP1 marks every module it manages (``_is_fsdp_managed_module``, read only by Dynamo) and
    Dynamo refuses those unless use_orig_params=True, which this project does not use
    (distributed/fsdp.py: flat parameters). The refusal is about tracing FSDP's own module code;
    here only the block's forward is compiled, called by the FSDP unit after its (eager) hooks
    gathered the flat parameter and set the block's weights as views of it. Dynamo then reads those
    views as graph inputs at every call (inlined module tracing), so each call computes with the
    weights just gathered and its gradients flow back into the flat parameter through the views,
    as in eager mode (tests/training/test_compile_training.py compares both under 2-rank FSDP)."""
    for module in block.modules():
        if getattr(module, "_is_fsdp_managed_module", False):
            module._is_fsdp_managed_module = False


def _compiled(module: nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


def _raise_recompile_limit(limit: int) -> None:
    import torch._dynamo.config as dynamo_config

    # Renamed in torch 2.7 (cache_size_limit -> recompile_limit); set whichever exists.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name) and getattr(dynamo_config, name) < limit:
            setattr(dynamo_config, name, limit)
