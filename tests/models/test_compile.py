"""Regional compilation (fastvideo/models/compile.py) of FLUX's two block classes inside the
wrapping training uses (FSDP full shard with flat parameters, activation checkpointing), on 2 gloo
ranks: no graph break (fullgraph), one graph per block class, input layout and grad mode for all
blocks, and the forward, the loss and the gradients equal the same wrapped model run eagerly.

The backend is torch's "aot_eager": Dynamo's capture plus AOTAutograd's forward/backward graphs,
run without code generation. A graph break or an autograd problem shows there already; inductor's
C++ build takes minutes on two loaded cores (its figures: bench/compile_check.py, docs/performance.md).
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import loss_fn, run_distributed, tiny_inputs, tiny_transformer


def _blocks(seed: int = 0):
    """The tiny preset's transformer with 2 double- and 3 single-stream blocks, every weight non-zero."""
    return tiny_transformer(seed, num_layers=2, num_single_layers=3)


def _input_layouts(classes) -> int:
    """(block class, strides of the tensor inputs) pairs an eager forward of _blocks() meets.

    Dynamo guards on strides, so each pair is a graph of its own (per grad mode). diffusers 0.32
    hands every block contiguous tensors (2 pairs); 0.42's single-stream block returns text and image
    tokens as slices of one tensor, so the blocks after the first see other strides (3 pairs)."""
    model, seen = _blocks(), set()

    def record(module, args, kwargs):
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        seen.add((type(module).__name__, tuple(t.stride() for t in tensors)))

    for module in model.modules():
        if isinstance(module, classes):
            module.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        model(**tiny_inputs(0, batch=2))
    return len(seen)


def _wrapped(info, compiled: bool):
    from fastvideo.distributed import fsdp
    from fastvideo.models.compile import compile_blocks
    from fastvideo.models.flux.family import FluxFamily

    classes = FluxFamily().block_classes()
    model = fsdp.wrap_model(_blocks(), "full", info.device, gradient_checkpointing=True, block_classes=classes)
    counts = compile_blocks(model, classes, "aot_eager") if compiled else None
    return model, counts


def _compiled_vs_eager(info):
    import torch._dynamo as dynamo

    from fastvideo.models.flux.family import FluxFamily

    # a forked child inherits the parent's Dynamo caches (an earlier test file on the same worker
    # compiled the same block classes: 6 graphs counted instead of 4); start from none
    dynamo.reset()
    out = {"layouts": _input_layouts(FluxFamily().block_classes())}
    for name in ("eager", "compiled"):
        model, counts = _wrapped(info, name == "compiled")
        dynamo.utils.counters.clear()
        with torch.no_grad():  # a rollout forward
            sample = model(**tiny_inputs(info.rank, batch=2))[0]
        loss = loss_fn(model, tiny_inputs(info.rank + 10, batch=2))  # an update: forward + backward
        loss.backward()
        out[name] = {"sample": sample, "loss": loss.detach(), "counts": counts,
                     "grads": [p.grad.clone() for p in model.parameters()],
                     "graphs": dynamo.utils.counters["stats"]["unique_graphs"],
                     "breaks": sum(dynamo.utils.counters["graph_break"].values())}
    return out


def test_compiled_blocks_under_fsdp_and_checkpointing_match_eager():
    for r in run_distributed(_compiled_vs_eager, world_size=2, timeout=600):
        eager, comp, layouts = r["eager"], r["compiled"], r["layouts"]
        assert comp["counts"] == {"FluxTransformerBlock": 2, "FluxSingleTransformerBlock": 3}
        # fullgraph=True: a break would raise; 5 blocks, 2 classes, 2 grad modes -> one graph per class,
        # input layout and grad mode: 4 graphs on diffusers 0.32, 6 on 0.42 (the later blocks of a
        # class and layout reuse the first's graph: their weights are graph inputs, not constants)
        assert layouts in (2, 3) and comp["breaks"] == 0 and comp["graphs"] == 2 * layouts, comp
        assert eager["graphs"] == 0
        # fp32 on CPU, the same kernels: forward and loss equal to rounding (measured: bit-exact);
        # AOTAutograd orders the backward's sums its own way (measured, torch 2.14 on both lines: up to
        # 11274 of a rank's 75520 gradient elements differ, by at most 4.8e-7 absolute)
        torch.testing.assert_close(comp["sample"], eager["sample"], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(comp["loss"], eager["loss"], rtol=1e-6, atol=1e-6)
        assert len(comp["grads"]) == len(eager["grads"]) > 0  # the flat shards of every unit
        for a, b in zip(comp["grads"], eager["grads"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
        assert all(g.abs().sum() > 0 for g in comp["grads"])


def test_a_model_without_the_blocks_is_refused():
    from fastvideo.models.compile import compile_blocks
    from fastvideo.models.flux.family import FluxFamily

    with pytest.raises(ValueError, match="contains no block of class FluxTransformerBlock"):
        compile_blocks(torch.nn.Linear(2, 2), FluxFamily().block_classes(), "eager")
