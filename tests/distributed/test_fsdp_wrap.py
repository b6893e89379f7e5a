"""wrap_model / clip_grad_norm: 2-process gloo parity with the unwrapped model, plus single-process checks."""

from __future__ import annotations

import os

import pytest
import torch
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo.distributed import fsdp
from upstream_facts import CHECKPOINT_FRACTIONS, load_facts


def weighted_loss(out: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    return (out * w).sum() + out.square().mean()


def reference(world_size: int = 2):
    """Unwrapped model: each rank's output, the rank-averaged gradients, and torch's clipping of
    them to half their norm (norm before clipping, clipped gradients)."""
    ref = tiny_transformer()
    outs, grads = [], {}
    for r in range(world_size):
        ref.zero_grad(set_to_none=True)
        out = ref(**tiny_inputs(r))[0]
        outs.append(out.detach())
        weighted_loss(out).backward()
        for name, p in ref.named_parameters():
            grads[name] = grads.get(name, 0) + p.grad / world_size
    for name, p in ref.named_parameters():
        p.grad = grads[name].clone()
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), total.item() / 2)
    clipped = {name: p.grad.clone() for name, p in ref.named_parameters()}
    return outs, grads, norm, clipped


def implied_sgd_grads(model) -> dict[str, torch.Tensor]:
    """Take one SGD(lr=1) step and return (before - after) per parameter name: the gradient the
    optimizer saw, read through the public full-state-dict path (rank 0; {} elsewhere)."""
    before = {k: v.clone() for k, v in fsdp.full_model_state_dict(model).items()}
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    after = fsdp.full_model_state_dict(model)
    return {k: before[k] - after[k] for k in before}


def check_gradients_and_clipping(model, rank: int, reference_values, where: str) -> None:
    """After a backward: clip_grad_norm measures the reference norm (1e-5), the optimizer sees the
    rank-averaged gradients (1e-5), and clipping to half the norm gives torch's clipped gradients."""
    _, grads, ref_norm, clipped = reference_values
    norm = fsdp.clip_grad_norm(model, None)  # measure only
    torch.testing.assert_close(norm, ref_norm, rtol=1e-5, atol=0, msg=where)
    seen = implied_sgd_grads(model)
    norm_clipped = fsdp.clip_grad_norm(model, ref_norm.item() / 2)  # grads are still there
    torch.testing.assert_close(norm_clipped, ref_norm, rtol=1e-5, atol=0, msg=where)
    seen_clipped = implied_sgd_grads(model)
    if rank == 0:
        assert set(seen) == set(grads), where
        for name in grads:
            torch.testing.assert_close(seen[name], grads[name], atol=1e-5, rtol=0, msg=f"{where} {name}")
            torch.testing.assert_close(seen_clipped[name], clipped[name], atol=1e-5, rtol=0,
                                       msg=f"{where} clipped {name}")


def _check_strategy(info, strategy: str, local_sizes: list[str | None]):
    reference_values = reference(info.world_size)
    outs, grads = reference_values[:2]
    for local in local_sizes:
        if local is not None:
            os.environ["LOCAL_WORLD_SIZE"] = local
        for checkpointing in (False, True):
            where = f"{strategy} LOCAL_WORLD_SIZE={local} checkpointing={checkpointing}"
            base = tiny_transformer()
            calls = []
            base.transformer_blocks[0].attn.register_forward_hook(lambda *a, calls=calls: calls.append(1))
            model = fsdp.wrap_model(base, strategy, info.device, gradient_checkpointing=checkpointing)
            if strategy != "none":
                from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

                assert len(FSDP.fsdp_modules(model)) == 3, where  # root + one unit per block
                if local == "2" and info.world_size == 4:
                    assert model.sharding_strategy.name == {"hybrid": "HYBRID_SHARD",
                                                            "hybrid_zero2": "_HYBRID_SHARD_ZERO2"}[strategy], where
                if strategy == "hybrid_zero2" and info.world_size == 2:  # one node: ZeRO-2 over all ranks
                    assert model.sharding_strategy.name == "SHARD_GRAD_OP", where
                if local == "1":  # one rank per node: pure replication (no all-gathers across nodes), not sharding
                    assert model.sharding_strategy.name == "NO_SHARD", where
            out = model(**tiny_inputs(info.rank))[0]
            torch.testing.assert_close(out, outs[info.rank], atol=1e-6, rtol=0, msg=where)
            weighted_loss(out).backward()
            assert len(calls) == (2 if checkpointing else 1), where  # recomputed in backward

            check_gradients_and_clipping(model, info.rank, reference_values, where)
    if strategy == "full":
        # bf16 compute over fp32 shards: master weights and reduced gradients stay fp32.
        policy = fsdp.PrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = fsdp.wrap_model(tiny_transformer(), strategy, info.device, mixed_precision=policy)
        out = model(**tiny_inputs(info.rank))[0]
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), outs[info.rank], atol=0.1, rtol=0.05)
        weighted_loss(out.float()).backward()
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
        seen = implied_sgd_grads(model)
        if info.rank == 0:
            # bf16 compute moves single small tensors a lot (the guidance embedding of 3500 in
            # bf16), so compare the whole gradient: direction and size within bf16 error (~8% here).
            got = torch.cat([seen[n].flatten() for n in grads])
            want = torch.cat([g.flatten() for g in grads.values()])
            assert torch.linalg.vector_norm(got - want) < 0.15 * torch.linalg.vector_norm(want)
    if strategy == "hybrid":
        os.environ["LOCAL_WORLD_SIZE"] = str(info.world_size + 1)
        with pytest.raises(ValueError, match=f"LOCAL_WORLD_SIZE={info.world_size + 1}"):
            fsdp.wrap_model(tiny_transformer(), "hybrid", info.device)
    return True


@pytest.mark.parametrize(
    "strategy,world_size,local_sizes",
    [("full", 2, [None]), ("hybrid", 2, ["1"]), ("hybrid", 4, ["2"]), ("none", 2, [None]),
     ("hybrid_zero2", 2, ["2"]), ("hybrid_zero2", 4, ["2"])],
    ids=["full", "hybrid-1-rank-per-node", "hybrid-2x2-mesh", "none-ddp", "zero2-one-node", "zero2-2x2-mesh"],
)
def test_wrapped_matches_unwrapped(strategy, world_size, local_sizes):
    """Forward equals the unwrapped model (1e-6); gradients equal the rank-average of single-process
    gradients (1e-5), with and without activation checkpointing; clip_grad_norm equals
    torch.nn.utils.clip_grad_norm_ on the unwrapped model, before and after clipping."""
    results = run_distributed(_check_strategy, strategy, local_sizes, world_size=world_size)
    assert results == [True] * world_size


def _fsdp1_options(info):
    block = type(tiny_transformer().transformer_blocks[0])
    policy = fsdp.PrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_inputs=False)
    model = fsdp._wrap_fsdp(tiny_transformer(), "full", info.device, policy, True, (block,), info.world_size,
                            forward_prefetch=True)
    plain = fsdp._wrap_fsdp(tiny_transformer(), "full", info.device, None, False, (block,), info.world_size)
    mp = model.mixed_precision
    return {"offload": model.cpu_offload.offload_params, "plain_offload": plain.cpu_offload.offload_params,
            "limit": model.limit_all_gathers, "prefetch": (model.forward_prefetch, plain.forward_prefetch),
            "mp": (str(mp.param_dtype), str(mp.reduce_dtype), mp.cast_root_forward_inputs),
            "plain_mp": str(plain.mixed_precision.param_dtype)}


def test_fsdp1_passes_its_options_through():
    """FSDP1's own options as wrap_model's helper sets them (the CPU wrap_model drops cpu_offload, so
    the helper is called directly): host-offloaded shards, bounded all-gathers, forward prefetch
    only when asked, the precision policy including its input casting; none of them by default."""
    for got in run_distributed(_fsdp1_options, world_size=2):
        assert got["offload"] is True and got["plain_offload"] is False and got["limit"] is True
        assert got["prefetch"] == (True, False)
        assert got["mp"] == ("torch.bfloat16", "torch.float32", False) and got["plain_mp"] == "None"


# ---------------------------------------------------------------- single process
def test_hybrid_mesh_shape():
    assert fsdp.hybrid_mesh_shape(16, 8) == (2, 8)
    assert fsdp.hybrid_mesh_shape(8, 8) == (1, 8)
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        fsdp.hybrid_mesh_shape(4, None)
    with pytest.raises(ValueError, match="multiple of the ranks per node"):
        fsdp.hybrid_mesh_shape(6, 4)
    with pytest.raises(ValueError, match="multiple of the ranks per node"):
        fsdp.hybrid_mesh_shape(2, 4)


def test_bad_arguments_fail_early():
    with pytest.raises(ValueError, match="unknown sharding strategy 'zero3'"):
        fsdp.wrap_model(tiny_transformer(), "zero3", "cpu")
    with pytest.raises(ValueError, match="DDP"):
        fsdp.wrap_model(tiny_transformer(), "none", "cpu", mixed_precision=(torch.bfloat16, torch.float32))
    with pytest.raises(ValueError, match="no module of class"):
        fsdp.wrap_model(torch.nn.Linear(2, 2), "full", "cpu")
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        fsdp.apply_activation_checkpointing(tiny_transformer(), fraction=1.5)


def test_one_process_gets_the_plain_module_and_selective_checkpointing():
    """No process group: the module itself comes back; checkpoint_fraction 0.5 checkpoints the
    first of the two blocks only, and gradients are unchanged by checkpointing."""
    plain = tiny_transformer()
    weighted_loss(plain(**tiny_inputs(0))[0]).backward()
    model = fsdp.wrap_model(tiny_transformer(), "full", "cpu", gradient_checkpointing=True, checkpoint_fraction=0.5)
    assert isinstance(model, type(plain))
    assert fsdp.is_checkpointed(model.transformer_blocks[0])
    assert not fsdp.is_checkpointed(model.single_transformer_blocks[0])
    weighted_loss(model(**tiny_inputs(0))[0]).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=0, msg=name)
    assert list(model.state_dict()) == list(plain.state_dict())  # names unchanged by checkpointing


def test_clip_grad_norm_single_process():
    model, ref = tiny_transformer(), tiny_transformer()
    for m in (model, ref):
        weighted_loss(m(**tiny_inputs(0))[0]).backward()
    norm = fsdp.clip_grad_norm(model, 0.1)
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    torch.testing.assert_close(norm, expected, rtol=0, atol=0)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("fraction", CHECKPOINT_FRACTIONS)
def test_selective_checkpointing_spaces_blocks_as_upstream(fraction):
    """Upstream's apply_fsdp_checkpointing (DanceGRPO 15cc71d fastvideo/utils/fsdp_util.py), run on 57
    stand-in blocks (FLUX: 19 double + 38 single), picks the same blocks as spaced_blocks (the picks are
    kept in tests/fixtures/upstream_facts.json, tests/upstream_facts.py)."""
    from fastvideo.distributed.selective import spaced_blocks

    picked = load_facts()["dancegrpo_selective_checkpointing"][repr(fraction)]
    assert spaced_blocks(57, fraction) == picked
    assert len(picked) == int(fraction * 57 + 0.5)
