"""FSDP communication per iteration and rank: the bytes all-gathered and reduce-scattered, by phase.

FSDP1 FULL_SHARD (and HYBRID_SHARD within a node) gathers a unit's parameters before its forward
and frees them after; a trained forward's backward gathers them again, then reduce-scatters the
gradients. So one iteration of GRPO moves, per rank (a ring collective receives (W-1)/W of the
full tensor, W = the shard group size):

    rollout   F_r = sampling_steps x ceil(samples / rollout_batch) forwards, each one gather of P
    update    T_u = ceil(samples / micro_batch) x trained_steps terms, each a forward and a backward
              gather of P and one reduce-scatter of the trainable parameters' gradients, plus one
              gather per no-grad forward of a term (NFT's old policy, a KL reference's copy)

with P the parameters FSDP manages, in bytes at the gather dtype (--fsdp_param_dtype: fp32 4,
bf16 2; gradients are reduced in fp32). Gradient checkpointing recomputes inside the backward's
gather (no extra traffic). Under LoRA the frozen base sits in the FSDP units too (gathered at its
bf16 dtype every forward) unless it is replicated outside FSDP (training/lora.py), when only the
adapters are gathered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CommShape:
    """What decides FSDP's traffic. params: parameters in FSDP units gathered at gather_bytes;
    frozen_params: parameters gathered at frozen_bytes (a LoRA base inside the units; 0 if none or
    replicated); trainable: parameters whose gradients are reduced (default: params)."""

    params: int
    samples_per_rank: int
    rollout_batch: int
    micro_batch: int
    sampling_steps: int
    trained_steps: int
    shards: int  # the shard group size (world size for full sharding; 1: no gathers)
    gather_bytes: int = 4
    reduce_bytes: int = 4
    frozen_params: int = 0
    frozen_bytes: int = 2
    trainable: int | None = None
    reference_params: int = 0  # a KL reference copy in FSDP units: gathered (no grad) once per update term
    nograd_update_forwards: int = 0  # per term, of the model's own units: NFT's v_old, a LoRA KL's v_ref
    keep_gathered: bool = False  # SHARD_GRAD_OP (--fsdp_sharding_strategy zero2): gathered until the backward
    # FSDP1's root unit (embedders, output layers: params outside the blocks) is not freed after a
    # forward: a rollout gathers it once, a term's backward reuses its forward's gather.
    root_params: int = 0
    units: int = 0  # FSDP units (the root + one per block): collective calls per whole-model gather; 0: unknown
    rollout_gathered: bool = False  # --rollout_weights gathered: the whole model gathered once per rollout
    rollout_swapped: bool = False  # the rollout samples with a swapped-in copy (NFT), which frees the root after
    timesteps_per_forward: int = 1  # --update_timesteps_per_forward: (sample, timestep) terms per forward
    reduce_per_step: int = 0  # --grad_sync per_step: micro-batches per optimizer step, one reduce-scatter each; 0: per term
    trained_per_rank: int = 0  # the samples the update trains (--bestofn: fewer than rolled out); 0: samples_per_rank


@dataclass(frozen=True)
class UnitPasses:
    """Whole-unit gathers of one phase: of the block units (all but the root) and of the root."""

    blocks: int
    root: int


def update_terms(s: CommShape) -> int:
    """Forward + backward passes of the update: micro-batches x ceil(T / timesteps per forward)."""
    per_micro = math.ceil(s.trained_steps / max(1, s.timesteps_per_forward))
    return math.ceil((s.trained_per_rank or s.samples_per_rank) / s.micro_batch) * per_micro


def reduce_sets(s: CommShape) -> int:
    """Whole-model gradient reduce-scatters per iteration: one per term, or (--grad_sync per_step)
    one per optimizer step (ceil(micro-batches / accumulation))."""
    if s.reduce_per_step:
        return math.ceil(math.ceil((s.trained_per_rank or s.samples_per_rank) / s.micro_batch) / s.reduce_per_step)
    return update_terms(s)


def gather_passes(s: CommShape) -> dict[str, UnitPasses]:
    """{"rollout": UnitPasses, "update": UnitPasses}: how often each part of the model is gathered."""
    forwards = s.sampling_steps * math.ceil(s.samples_per_rank / s.rollout_batch)
    terms = update_terms(s)
    nograd = s.nograd_update_forwards * terms  # each a whole gather (a swap frees the root around it)
    if s.keep_gathered:
        # the rollout's first forward gathers and the rest reuse it; each term then gathers once
        # (its forward; its backward reuses it, then frees), the first reusing the rollout's
        return {"rollout": UnitPasses(1, 1), "update": UnitPasses(terms - 1 + nograd, terms - 1 + nograd)}
    rollout = UnitPasses(1, 1) if s.rollout_gathered else UnitPasses(forwards, 1)
    # a term gathers the blocks in its forward and again in its backward, the root once; the first
    # term reuses the root the rollout left gathered (unless the rollout freed it)
    carried = int(not (s.rollout_gathered or s.rollout_swapped) and s.root_params > 0)
    return {"rollout": rollout, "update": UnitPasses(2 * terms + nograd, terms + nograd - carried)}


def predicted_collectives(s: CommShape) -> dict[str, dict[str, tuple[int, int]]]:
    """{phase: {kind: (calls, bytes)}} of FSDP's all-gathers and reduce-scatters on one rank, in
    fastvideo.distributed.comm_count's terms (bytes of the whole gathered / reduced tensor, before
    FSDP's padding to a multiple of the shard count); calls are 0 when s.units is not known."""
    if s.shards <= 1:
        return {"rollout": {}, "update": {}}
    block_bytes = (s.params - s.root_params) * s.gather_bytes + s.frozen_params * s.frozen_bytes
    root_bytes = s.root_params * s.gather_bytes
    blocks = max(0, s.units - 1) if s.root_params else s.units
    out = {}
    for phase, p in gather_passes(s).items():
        calls = p.blocks * blocks + (p.root if s.root_params else 0)
        out[phase] = {"all_gather": (calls, p.blocks * block_bytes + p.root * root_bytes)}
    terms = update_terms(s)
    trainable = s.params if s.trainable is None else s.trainable
    reduces = reduce_sets(s)
    out["update"]["reduce_scatter"] = (reduces * s.units, reduces * trainable * s.reduce_bytes)
    if s.reference_params:  # a frozen copy's units: gathered (no grad) in every term
        calls, nbytes = out["update"]["all_gather"]
        out["update"]["all_gather"] = (calls, nbytes + terms * s.reference_params * s.gather_bytes)
    return out


def fsdp_traffic(s: CommShape) -> dict[str, float]:
    """Bytes one rank receives per iteration: rollout_gather, update_gather, reduce_scatter, their
    total and the gathers (whole-model passes that gather, the root's alone not counted)."""
    if s.shards <= 1:
        return {"rollout_gather": 0.0, "update_gather": 0.0, "reduce_scatter": 0.0, "total": 0.0,
                "gathers": 0}
    ring = (s.shards - 1) / s.shards
    c = predicted_collectives(s)
    passes = gather_passes(s)
    out = {
        "rollout_gather": c["rollout"]["all_gather"][1] * ring,
        "update_gather": c["update"]["all_gather"][1] * ring,
        "reduce_scatter": c["update"]["reduce_scatter"][1] * ring,
        "gathers": passes["rollout"].blocks + passes["update"].blocks
        + (update_terms(s) if s.reference_params else 0),
    }
    out["total"] = out["rollout_gather"] + out["update_gather"] + out["reduce_scatter"]
    return out


def gather_dtype_table(s: CommShape) -> list[str]:
    """Lines comparing fp32 and bf16 gathers (--fsdp_param_dtype) for one shape, in GB per iteration."""
    gb = 1e9
    lines = [f"FSDP traffic per rank per iteration ({s.shards} shards): GB received",
             f"{'gather dtype':<14}{'rollout':>10}{'update':>10}{'reduce':>10}{'total':>10}"]
    for name, nbytes in (("fp32", 4), ("bf16", 2)):
        t = fsdp_traffic(CommShape(**{**s.__dict__, "gather_bytes": nbytes}))
        lines.append(f"{name:<14}{t['rollout_gather'] / gb:>10.1f}{t['update_gather'] / gb:>10.1f}"
                     f"{t['reduce_scatter'] / gb:>10.1f}{t['total'] / gb:>10.1f}")
    return lines


def today(s: CommShape) -> CommShape:
    """``s`` with the defaults: fp32 gathers, the rollout gathering per forward, one timestep per forward,
    a gradient reduce-scatter per term."""
    return replace(s, gather_bytes=4, rollout_gathered=False, timesteps_per_forward=1, reduce_per_step=0)


def comparison_table(s: CommShape) -> list[str]:
    """Lines: GB per rank per iteration with the defaults and with ``s``'s options, and the ratio."""
    gb, rows = 1e9, [("default", fsdp_traffic(today(s))), ("these options", fsdp_traffic(s))]
    lines = [f"FSDP traffic per rank per iteration, the defaults vs these options ({s.gather_bytes * 8}-bit gathers, "
             f"rollout {'gathered once' if s.rollout_gathered else 'gathered per forward'}, "
             f"{s.timesteps_per_forward} timestep(s) per update forward): GB received",
             f"{'':<14}{'rollout':>10}{'update':>10}{'reduce':>10}{'total':>10}"]
    for name, t in rows:
        lines.append(f"{name:<14}{t['rollout_gather'] / gb:>10.1f}{t['update_gather'] / gb:>10.1f}"
                     f"{t['reduce_scatter'] / gb:>10.1f}{t['total'] / gb:>10.1f}")
    if rows[1][1]["total"] > 0:
        lines.append(f"the defaults move {rows[0][1]['total'] / rows[1][1]['total']:.1f}x these options' bytes")
    return lines


def from_memory_shape(m, prof, trained_steps: int, nograd_update_forwards: int = 0) -> CommShape:
    """The CommShape of a perf.memory.MemoryShape (the cost model's --memory flags) and its
    ModelProfile: under LoRA the adapters are gathered and reduced, the frozen base gathered only
    where it is sharded; a full fine-tune's KL reference copy is gathered for its forwards;
    ``nograd_update_forwards`` more forwards of the model's own units per term (NFT's v_old, a LoRA
    run's v_ref with the adapters off)."""
    lora = m.lora_rank > 0
    return CommShape(params=prof.adapter_params if lora else prof.params, samples_per_rank=m.samples_per_rank,
                     rollout_batch=m.rollout_batch, micro_batch=m.micro_batch, sampling_steps=m.sampling_steps,
                     trained_steps=trained_steps, shards=m.shards if m.strategy != "none" else 1,
                     gather_bytes=m.gather_bytes,
                     frozen_params=prof.params if lora and not m.lora_replicate_base else 0,
                     frozen_bytes=m.lora_base_bytes,
                     reference_params=prof.params if m.kl_reference and not lora else 0,
                     nograd_update_forwards=nograd_update_forwards, keep_gathered=m.strategy == "zero2",
                     root_params=prof.root_adapter_params if lora else prof.root_params, units=prof.units,
                     rollout_gathered=m.rollout_gathered, rollout_swapped=m.old_policy,
                     timesteps_per_forward=min(m.timesteps_per_forward, trained_steps),
                     reduce_per_step=m.accumulation if m.grads_unsharded else 0, trained_per_rank=m.trained_per_rank)


def traffic_by_gather_dtype(s: CommShape) -> dict[str, dict[str, float]]:
    """{"fp32": fsdp_traffic, "bf16": fsdp_traffic} of one shape."""
    return {name: fsdp_traffic(CommShape(**{**s.__dict__, "gather_bytes": b})) for name, b in (("fp32", 4), ("bf16", 2))}


def shape_of_model(model, blocks) -> dict[str, int]:
    """{"params", "root_params", "units"} of a transformer (meta or real, unwrapped) whose FSDP units
    are its ``blocks`` (family.blocks(model)) and the root."""
    params = sum(p.numel() for p in model.parameters())
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    return {"params": params, "root_params": params - in_blocks, "units": len(blocks) + 1}
