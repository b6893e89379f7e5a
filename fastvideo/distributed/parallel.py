"""Parallel dimensions: which ranks share data and which shard the model, and their groups.

    dims = ParallelDims.build(world_size, rank, dp_shard=..., sp=1)   # once, at start-up
    dims.dp_rank, dims.dp_size                                          # the data-parallel position
    dims.gather_dp(t); dims.all_reduce_mean(t); dims.all_reduce_max(t)  # collectives on the dp group

World = dp_replicate x dp_shard x sp. Data-parallel ranks see different prompts; the sp ranks of a
sequence group (consecutive ranks: dp_rank = rank // sp, sp_rank = rank % sp) hold the same
samples and split their image tokens (distributed/sequence_parallel.py). Every collective names
the group it means, so nothing assumes that the data-parallel world is the whole world. The
process groups are the default world group while sp = 1 (no extra communicator is created: on
HCCL each group costs device memory and set-up time); with sp > 1, init_groups() makes the
sequence groups and the data-parallel groups (one per sp position) once, on every rank.
FSDP shards over the whole world either way (docs/parallelism.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastvideo.errors import ConfigError


# (world size, sp) -> ([dp group of each sp position], [sp group of each dp rank]); made by init_groups.
_GROUPS: dict[tuple[int, int], tuple] = {}


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    rank: int
    dp_replicate: int
    dp_shard: int
    sp: int = 1

    def __post_init__(self):
        if self.sp < 1 or self.world_size % self.sp:
            raise ConfigError(f"--sp_size {self.sp} does not divide the world size {self.world_size}: use a divisor "
                              "of the number of processes (or change --nproc_per_node)")
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
    def sp_rank(self) -> int:
        return self.rank % self.sp

    @property
    def dp_group(self):
        """The data-parallel process group: this sp position's ranks (None: the default group, which
        it is while sp = 1)."""
        return None if self.sp == 1 else _GROUPS[(self.world_size, self.sp)][0][self.sp_rank]

    @property
    def sp_group(self):
        """This rank's sequence group (None while sp = 1)."""
        return None if self.sp == 1 else _GROUPS[(self.world_size, self.sp)][1][self.dp_rank]

    def init_groups(self) -> "ParallelDims":
        """Create the sequence and data-parallel groups (sp > 1; every rank calls this once, in the
        same order, after the process group is up). Idempotent."""
        import torch.distributed as dist

        key = (self.world_size, self.sp)
        if self.sp == 1 or _GROUPS.get(key, (None, None, None))[2] is dist.group.WORLD:
            return self

        dp = self.world_size // self.sp
        dp_groups = [dist.new_group([d * self.sp + s for d in range(dp)]) for s in range(self.sp)]
        sp_groups = [dist.new_group([d * self.sp + s for s in range(self.sp)]) for d in range(dp)]
        _GROUPS[key] = (dp_groups, sp_groups, dist.group.WORLD)  # a new world: new groups
        return self

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
        """In place, over the whole world: the ranks of a sequence group hold the same samples, so
        the maximum over the world is the maximum over the data-parallel ranks, and a decision
        made from it (skip a step, stop, rank 0's flag) is the same on every rank."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def describe(self) -> dict:
        return {"world_size": self.world_size, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard,
                "sp": self.sp}
