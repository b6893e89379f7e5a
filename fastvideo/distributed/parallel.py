"""Parallel dimensions: which ranks share data and which shard the model, and their groups.

    dims = ParallelDims.build(world_size, rank, dp_shard=..., sp=1)   # once, at start-up
    dims.dp_rank, dims.dp_size                                          # the data-parallel position
    dims.gather_dp(t); dims.all_reduce_mean(t); dims.all_reduce_max(t)  # collectives on the dp group

World = dp_replicate x dp_shard x sp. Data-parallel ranks see different prompts; sequence-parallel
ranks (sp > 1, not built yet) would share a prompt and split its tokens. Every collective names
the group it means, so nothing assumes that the data-parallel world is the whole world. The
process groups are the default world group while sp = 1 (no extra communicator is created: on
HCCL each group costs device memory and set-up time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastvideo.errors import ConfigError


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    rank: int
    dp_replicate: int
    dp_shard: int
    sp: int = 1

    def __post_init__(self):
        if self.sp != 1:
            raise ConfigError(f"sequence parallel size {self.sp}: only 1 is supported (--sp_size 1)")
        if self.dp_replicate * self.dp_shard * self.sp != self.world_size:
            raise ConfigError(f"parallel dims dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x sp "
                              f"{self.sp} do not multiply to the world size {self.world_size}")

    @classmethod
    def build(cls, world_size: int, rank: int, strategy: str = "full", sp: int = 1,
              ranks_per_node: int | None = None) -> "ParallelDims":
        """From the FSDP strategy: full shards over all data-parallel ranks; hybrid shards within a
        node (ranks_per_node, default all) and replicates across nodes; none replicates."""
        dp = world_size // sp
        if strategy == "none":
            return cls(world_size, rank, dp_replicate=dp, dp_shard=1, sp=sp)
        if strategy in ("hybrid", "hybrid_zero2"):
            shard = min(ranks_per_node or dp, dp)
            return cls(world_size, rank, dp_replicate=dp // shard, dp_shard=shard, sp=sp)
        return cls(world_size, rank, dp_replicate=1, dp_shard=dp, sp=sp)

    # ------------------------------------------------------------------ positions
    @property
    def dp_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp

    @property
    def dp_group(self):
        """The data-parallel process group (None: the default group, which it is while sp = 1)."""
        return None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives on the dp group
    def gather_dp(self, t: torch.Tensor) -> torch.Tensor:
        """Every data-parallel rank's [B] tensor, concatenated in dp-rank order ([dp*B])."""
        if self.dp_size == 1:
            return t
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.dp_size)]
        dist.all_gather(parts, t.contiguous(), group=self.dp_group)
        return torch.cat(parts)

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        """In place: SUM / dp size (HCCL has no ReduceOp.AVG)."""
        if self.dp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.dp_group)
            t.div_(self.dp_size)
        return t

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.dp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.dp_group)
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        if self.dp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.dp_group)
        return t

    def describe(self) -> dict:
        return {"world_size": self.world_size, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard,
                "sp": self.sp}
