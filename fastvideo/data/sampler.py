"""Group-aware distributed prompt sampler with an exact, checkpointable position.

GRPO needs each prompt's G samples on one rank (their advantages are normalised together), so the
sampler deals whole prompts: each iteration, every rank receives ``prompts_per_rank`` prompt
indices and generates its G samples for each of them locally.

Order: epoch e shuffles all N prompts with ``torch.randperm(N, generator=seeded(sampler_seed + e))``;
rank r takes every W-th prompt of that order starting at r, and iteration i gives rank r the
prompts i*P .. i*P+P-1 of its share. This is exactly what torch's
``DistributedSampler(shuffle=True, seed=sampler_seed, drop_last=True)`` with ``set_epoch(e)``,
batched by a ``DataLoader(batch_size=P, drop_last=True)``, yields (a test checks it), so a run can
be compared prompt for prompt with DanceGRPO's data order.

Tail: an epoch has ``(N // W) // P`` iterations; the N - W * P * iterations prompts left at the end
of the shuffled order are skipped for that epoch (different ones each epoch), so that every rank
always gets exactly P prompts and no prompt is duplicated to pad. Iteration never ends: after the
last iteration of epoch e comes the first of epoch e + 1.
"""

from __future__ import annotations

from typing import Callable

import torch

from fastvideo.errors import CheckpointError, ConfigError

# order_fn(epoch, num_prompts) -> LongTensor [num_prompts], a permutation of range(num_prompts)
OrderFn = Callable[[int, int], torch.Tensor]


def seeded_permutation(seed: int, n: int) -> torch.Tensor:
    """randperm(n) from a CPU generator seeded with ``seed`` (identical on every machine)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return torch.randperm(n, generator=g)


def epoch_order_fn(sampler_seed: int) -> OrderFn:
    """The default: a fresh shuffle per epoch, seeded with sampler_seed + epoch (torch's rule)."""
    return lambda epoch, n: seeded_permutation(sampler_seed + epoch, n)


def repeat_first_epoch_order_fn(sampler_seed: int) -> OrderFn:
    """DanceGRPO's effective order: it calls ``set_epoch(0)`` once and re-iterates its DataLoader,
    so every epoch repeats epoch 0's shuffle. Use this to replay an upstream run."""
    return lambda epoch, n: seeded_permutation(sampler_seed, n)



def too_few_prompts(num_prompts: int, world_size: int, prompts_per_rank: int) -> str:
    """The message for an index too small for one iteration (the sampler's and the pre-flight's)."""
    return (f"{num_prompts} prompts cannot fill one iteration of {world_size} ranks x {prompts_per_rank} "
            "prompts: add prompts, or lower --train_batch_size or the number of processes")

class GroupDistributedSampler:
    """Infinite iterator of this rank's prompt indices, ``prompts_per_rank`` per iteration."""

    def __init__(
        self,
        num_prompts: int,
        rank: int,
        world_size: int,
        prompts_per_rank: int = 1,
        sampler_seed: int = 0,
        order_fn: OrderFn | None = None,
        shuffle: bool = True,
    ):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        if prompts_per_rank < 1:
            raise ValueError(f"prompts_per_rank must be at least 1, got {prompts_per_rank}")
        if num_prompts < world_size * prompts_per_rank:  # the user's data and flags: one line, exit 2
            raise ConfigError(too_few_prompts(num_prompts, world_size, prompts_per_rank))
        self.num_prompts = num_prompts
        self.rank = rank
        self.world_size = world_size
        self.prompts_per_rank = prompts_per_rank
        self.sampler_seed = sampler_seed
        self.shuffle = shuffle
        self.order_fn = order_fn or epoch_order_fn(sampler_seed)
        self.epoch = 0
        self.position = 0  # iterations of ``epoch`` already handed out
        self._cache: tuple[int, torch.Tensor] | None = None  # (epoch, this rank's share)

    @property
    def iterations_per_epoch(self) -> int:
        return (self.num_prompts // self.world_size) // self.prompts_per_rank

    @property
    def dropped_per_epoch(self) -> int:
        """Prompts skipped at the end of each epoch's order (see the module docstring)."""
        return self.num_prompts - self.iterations_per_epoch * self.world_size * self.prompts_per_rank

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """All N prompt indices in epoch ``epoch``'s order, LongTensor [N]."""
        n = self.num_prompts
        if not self.shuffle:
            return torch.arange(n)
        order = torch.as_tensor(self.order_fn(epoch, n))
        if order.shape != (n,) or order.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"order_fn({epoch}, {n}) returned {order.dtype} {tuple(order.shape)}, not a LongTensor [{n}]"
            )
        if not torch.equal(torch.sort(order).values.long(), torch.arange(n)):
            raise ValueError(f"order_fn({epoch}, {n}) did not return a permutation of range({n})")
        return order.long()

    def _share(self, epoch: int, rank: int) -> torch.Tensor:
        """Rank ``rank``'s prompts for the epoch, in order: every W-th from ``rank``."""
        usable = (self.num_prompts // self.world_size) * self.world_size
        return self.epoch_order(epoch)[rank:usable:self.world_size]

    def batch_at(self, epoch: int, position: int, rank: int | None = None) -> list[int]:
        """The prompts ``rank`` (default: this one) gets at iteration ``position`` of ``epoch``."""
        if not 0 <= position < self.iterations_per_epoch:
            raise IndexError(f"position {position} is outside 0..{self.iterations_per_epoch - 1}")
        rank = self.rank if rank is None else rank
        if rank == self.rank:
            if self._cache is None or self._cache[0] != epoch:
                self._cache = (epoch, self._share(epoch, rank))
            share = self._cache[1]
        else:
            share = self._share(epoch, rank)
        p = self.prompts_per_rank
        return share[position * p:(position + 1) * p].tolist()

    def next_batch(self) -> list[int]:
        """Global prompt indices for this rank's next iteration (length prompts_per_rank)."""
        if self.position >= self.iterations_per_epoch:
            self.epoch += 1
            self.position = 0
        batch = self.batch_at(self.epoch, self.position)
        self.position += 1
        return batch

    def __iter__(self) -> "GroupDistributedSampler":
        return self

    def __next__(self) -> list[int]:
        return self.next_batch()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first iteration."""
        self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where this sampler is (the same on every rank)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_prompts": self.num_prompts,
            "world_size": self.world_size,
            "prompts_per_rank": self.prompts_per_rank,
            "sampler_seed": self.sampler_seed,
        }

    def load_state_dict(self, state: dict, strict: bool | None = None) -> None:
        """Restore a position saved by ``state_dict``; the data and layout must be the same unless
        ``strict`` is False (--resume_allow_changes: the saved position is kept, its meaning changes).
        strict None: the sampler's ``strict_resume`` attribute (default True)."""
        strict = getattr(self, "strict_resume", True) if strict is None else strict
        for key in ("num_prompts", "world_size", "prompts_per_rank", "sampler_seed"):
            if strict and key in state and state[key] != getattr(self, key):
                raise CheckpointError(
                    f"the checkpoint's sampler was made with {key}={state[key]} but this run has "
                    f"{key}={getattr(self, key)}: resume with the same prompts, process count, "
                    "train_batch_size and sampler_seed"
                )
        position = int(state["position"])
        if not 0 <= position <= self.iterations_per_epoch:
            if strict:
                raise CheckpointError(f"sampler position {position} is outside 0..{self.iterations_per_epoch}")
            position = self.iterations_per_epoch  # the next batch starts the next epoch
        self.epoch, self.position = int(state["epoch"]), position
