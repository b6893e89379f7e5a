"""Parallelism settings: how FSDP shards the model and whether it offloads to the CPU.
TrainConfig keeps them at its top level (cfg.fsdp_strategy, cfg.cpu_offload)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group


# hybrid_full is upstream DanceGRPO's name of hybrid (FSDP HYBRID_SHARD)
STRATEGY_CHOICES = ("full", "hybrid", "hybrid_full", "hybrid_zero2", "none")


@dataclass
class ParallelSettings(Settings):
    fsdp_strategy: str  # full | hybrid | none
    cpu_offload: bool

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "parallelism")
        g.add_argument("--fsdp_sharding_strategy", type=str, default="full", choices=list(STRATEGY_CHOICES),
                       help="FSDP sharding: full (every rank holds a shard), hybrid (= upstream's hybrid_full: "
                            "shard within a node, replicate across nodes), hybrid_zero2 (the same, gathered "
                            "parameters kept from forward to backward), none (replicate)")
        g.add_argument("--use_cpu_offload", action="store_true", help="keep FSDP's parameter shards on the CPU")
        g.add_argument("--sp_size", type=int, default=1, help="sequence parallel size; must be 1")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ParallelSettings":
        if args.sp_size != 1:
            raise ConfigError(f"--sp_size {args.sp_size}: sequence parallelism is not supported; use --sp_size 1")
        strategy = "hybrid" if args.fsdp_sharding_strategy == "hybrid_full" else args.fsdp_sharding_strategy
        return cls(strategy, args.use_cpu_offload).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        """section: the whole resolved config (TrainConfig keeps these at its top level)."""
        return {"fsdp_sharding_strategy": section["fsdp_strategy"], "use_cpu_offload": section["cpu_offload"]}

    def check(self) -> None:
        if self.cpu_offload and self.fsdp_strategy == "none":
            raise ConfigError("--use_cpu_offload needs FSDP sharding (--fsdp_sharding_strategy full or hybrid)")
