"""Parallelism settings: how FSDP shards the model, whether it offloads to the CPU, the dtype it
gathers parameters in and whether it prefetches the next block's gather in forward. TrainConfig's
parallel section; config.json keeps its keys at the top level, and cfg.fsdp_strategy reads
cfg.parallel.fsdp_strategy."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group


# hybrid_full is upstream DanceGRPO's name of hybrid (FSDP HYBRID_SHARD)
STRATEGY_CHOICES = ("full", "zero2", "hybrid", "hybrid_full", "hybrid_zero2", "none")
ROLLOUT_WEIGHTS = ("sharded", "gathered", "auto")


@dataclass
class ParallelSettings(Settings):
    fsdp_strategy: str  # full | hybrid | none
    cpu_offload: bool
    fsdp_param_dtype: str = "fp32"  # fp32 | bf16: the dtype FSDP all-gathers (and computes) parameters in
    fsdp_forward_prefetch: bool = False
    rollout_weights: str = "sharded"  # sharded | gathered | auto: fsdp.gathered_forwards around no-grad passes
    sp_size: int = 1  # the ranks of a sequence group (Ulysses sequence parallelism)
    fsdp_version: int = 1  # 1: FullyShardedDataParallel (flat parameters), 2: fully_shard (distributed/fsdp2.py)

    section = "parallel"
    top_level = True  # config.json keeps these at its top level; cfg.<field> reads them

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "parallelism")
        g.add_argument("--fsdp_sharding_strategy", type=str, default="full", choices=list(STRATEGY_CHOICES),
                       help="FSDP sharding: full (every rank holds a shard), zero2 (the same, gathered parameters "
                            "kept from forward to backward: a rollout gathers once; needs the unsharded model to "
                            "fit a device), hybrid (= upstream's hybrid_full: "
                            "shard within a node, replicate across nodes), hybrid_zero2 (the same, gathered "
                            "parameters kept from forward to backward), none (replicate)")
        g.add_argument("--fsdp_version", type=int, default=1, choices=[1, 2],
                       help="FSDP implementation: 1 (FullyShardedDataParallel, flat parameters; upstream's and "
                            "the Ascend recipe's) or 2 (fully_shard: per-parameter DTensor shards, the same maths "
                            "and bytes; every strategy but none, bf16 gathers, CPU offload, --rollout_weights, "
                            "--grad_sync; not --checkpoint_format sharded)")
        g.add_argument("--use_cpu_offload", action="store_true", help="keep FSDP's parameter shards on the CPU")
        g.add_argument("--sp_size", type=int, default=1,
                       help="sequence parallel size N: the world is (data-parallel ranks) x N; the N ranks of a "
                            "sequence group hold the same samples and split each forward's image tokens "
                            "(Ulysses attention; docs/parallelism.md). N must divide the world size, the "
                            "attention heads and the image tokens")
        g.add_argument("--fsdp_param_dtype", type=str, default="fp32", choices=["fp32", "bf16"],
                       help="dtype FSDP all-gathers parameters in: fp32 (upstream) or bf16 (half the gather "
                            "traffic; gradients still reduced in fp32 into fp32 master shards; needs "
                            "--mixed_precision bf16)")
        g.add_argument("--fsdp_forward_prefetch", action="store_true",
                       help="FSDP issues the next block's all-gather before the current block's forward "
                            "(overlap in rollouts, which run forward only)")
        g.add_argument("--rollout_weights", type=str, default="sharded", choices=list(ROLLOUT_WEIGHTS),
                       help="the trained model's weights during no-grad passes over many steps (the rollout, "
                            "NFT's old-policy rollout, evaluation, a frozen KL reference in the update): sharded "
                            "(FSDP gathers every block at every step), gathered (each unit gathered once, in the "
                            "gather dtype, kept for the whole pass, then freed: the whole model on each device; "
                            "the same numbers), auto (gathered where the memory model says it fits, said at "
                            "start-up)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ParallelSettings":
        if args.sp_size < 1:
            raise ConfigError(f"--sp_size {args.sp_size}: the sequence parallel size must be >= 1 (1: off)")
        strategy = "hybrid" if args.fsdp_sharding_strategy == "hybrid_full" else args.fsdp_sharding_strategy
        return cls(strategy, args.use_cpu_offload, args.fsdp_param_dtype, args.fsdp_forward_prefetch,
                   args.rollout_weights, args.sp_size, args.fsdp_version).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        """section: its part of the resolved config (config.json keeps its keys at the top level)."""
        return {"fsdp_sharding_strategy": section["fsdp_strategy"], "use_cpu_offload": section["cpu_offload"],
                "fsdp_param_dtype": section.get("fsdp_param_dtype", "fp32"),
                "fsdp_forward_prefetch": section.get("fsdp_forward_prefetch", False),
                "rollout_weights": section.get("rollout_weights", "sharded"), "sp_size": section.get("sp_size", 1),
                "fsdp_version": section.get("fsdp_version", 1)}

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        if args.rollout_weights == "gathered" and args.fsdp_sharding_strategy in ("none", "zero2", "hybrid_zero2"):
            return [f"--rollout_weights gathered has no effect with --fsdp_sharding_strategy "
                    f"{args.fsdp_sharding_strategy}: its weights are already whole (DDP) or kept gathered (zero2)"]
        return []

    def check(self) -> None:
        if self.cpu_offload and self.fsdp_strategy == "none":
            raise ConfigError("--use_cpu_offload needs FSDP sharding (--fsdp_sharding_strategy full or hybrid)")
        for flag, on in (("--fsdp_param_dtype bf16", self.fsdp_param_dtype == "bf16"),
                         ("--fsdp_forward_prefetch", self.fsdp_forward_prefetch),
                         ("--fsdp_version 2", self.fsdp_version == 2)):
            if on and self.fsdp_strategy == "none":
                raise ConfigError(f"{flag} is an FSDP setting; --fsdp_sharding_strategy none (DDP) has no "
                                  "parameter gathers: use full or hybrid")

    def check_across(self, sections: dict) -> None:
        mixed = sections["model"].mixed_precision
        if self.fsdp_param_dtype == "bf16" and mixed != "bf16":
            raise ConfigError("--fsdp_param_dtype bf16 computes with bf16 parameters: it needs --mixed_precision bf16 "
                              f"(autocast), not {mixed!r}")
        if self.fsdp_version == 2 and sections["output"].checkpoint_format == "sharded":
            raise ConfigError("--checkpoint_format sharded writes FSDP1's flat shards: with --fsdp_version 2 use "
                              "--checkpoint_format gathered (the default), or --fsdp_version 1")
