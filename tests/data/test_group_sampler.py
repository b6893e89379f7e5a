"""The group-aware distributed sampler (fastvideo.data.sampler)."""

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from fastvideo.data.sampler import GroupDistributedSampler, repeat_first_epoch_order_fn
from fastvideo.errors import CheckpointError


def samplers(n, world, per_rank, seed=1223627, **kw):
    return [GroupDistributedSampler(n, r, world, per_rank, seed, **kw) for r in range(world)]


def take(sampler, k):
    return [sampler.next_batch() for _ in range(k)]


@pytest.mark.parametrize("n, world, per_rank", [(24, 4, 2), (30, 3, 5), (7, 1, 7)])
def test_every_prompt_exactly_once_per_epoch(n, world, per_rank):
    ss = samplers(n, world, per_rank)
    ipe = ss[0].iterations_per_epoch
    assert ipe * world * per_rank == n and ss[0].dropped_per_epoch == 0
    orders = []
    for epoch in range(3):
        seen = [i for s in ss for b in take(s, ipe) for i in b]
        assert sorted(seen) == list(range(n)), f"epoch {epoch} is not a partition"
        assert all(s.epoch == epoch for s in ss)
        orders.append(seen)
    assert orders[0] != orders[1] != orders[2], "each epoch reshuffles"


def test_tail_is_dropped_evenly_and_ranks_stay_disjoint():
    n, world, per_rank = 23, 3, 2  # 23 // 3 = 7 per rank, 3 iterations of 2 -> 18 used, 5 dropped
    ss = samplers(n, world, per_rank)
    assert ss[0].iterations_per_epoch == 3 and ss[0].dropped_per_epoch == 5
    per_epoch = [set(), set()]
    for epoch in range(2):
        batches = [take(s, 3) for s in ss]
        assert all(len(b) == per_rank for rank_batches in batches for b in rank_batches)
        flat = [i for rb in batches for b in rb for i in b]
        assert len(flat) == len(set(flat)) == 18
        per_epoch[epoch] = set(flat)
    assert per_epoch[0] != per_epoch[1], "a different tail is dropped each epoch"


@pytest.mark.parametrize("n, world, per_rank, seed", [(20, 4, 2, 1223627), (23, 3, 2, 42), (50, 2, 3, 0)])
def test_matches_torch_distributed_sampler_with_dataloader(n, world, per_rank, seed):
    """Parity with DanceGRPO's data path: DistributedSampler(shuffle, seed, drop_last) batched by a
    DataLoader(batch_size=P, drop_last=True), with set_epoch(e)."""
    for rank in range(world):
        ours = GroupDistributedSampler(n, rank, world, per_rank, seed)
        ref = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        for epoch in range(3):
            ref.set_epoch(epoch)
            expected = [b.tolist() for b in DataLoader(range(n), batch_size=per_rank, sampler=ref, drop_last=True)]
            assert take(ours, ours.iterations_per_epoch) == expected


def test_state_dict_restores_the_exact_position_across_epochs():
    n, world, per_rank = 10, 2, 2  # 2 iterations per epoch: 7 steps cross three epoch boundaries
    for rank in range(world):
        a = GroupDistributedSampler(n, rank, world, per_rank, sampler_seed=7)
        take(a, 3)
        state = a.state_dict()
        assert (state["epoch"], state["position"]) == (1, 1)
        expected = take(a, 7)
        b = GroupDistributedSampler(n, rank, world, per_rank, sampler_seed=7)
        b.load_state_dict(state)
        assert take(b, 7) == expected
        # a state saved at the end of an epoch rolls over on the next call
        c = GroupDistributedSampler(n, rank, world, per_rank, sampler_seed=7)
        c.load_state_dict({**state, "epoch": 4, "position": 2})
        assert c.next_batch() == c.batch_at(5, 0) and c.epoch == 5


def test_load_state_dict_rejects_another_layout():
    s = GroupDistributedSampler(12, 0, 2, 2, sampler_seed=1)
    state = s.state_dict()
    with pytest.raises(CheckpointError, match="world_size=2 but this run has world_size=3"):
        GroupDistributedSampler(12, 0, 3, 2, sampler_seed=1).load_state_dict(state)
    with pytest.raises(CheckpointError, match="sampler_seed=1 but this run has sampler_seed=2"):
        GroupDistributedSampler(12, 0, 2, 2, sampler_seed=2).load_state_dict(state)
    with pytest.raises(CheckpointError, match="position 9 is outside"):
        s.load_state_dict({**state, "position": 9})


def test_iterator_protocol_is_infinite_and_seeded():
    a = GroupDistributedSampler(6, 1, 2, 1, sampler_seed=3)
    got = list(itertools.islice(a, 10))  # 3 iterations per epoch -> into epoch 3
    assert a.epoch == 3 and len(got) == 10
    b = GroupDistributedSampler(6, 1, 2, 1, sampler_seed=3)
    assert list(itertools.islice(iter(b), 10)) == got
    c = GroupDistributedSampler(6, 1, 2, 1, sampler_seed=4)
    assert list(itertools.islice(c, 10)) != got


def test_order_fn_replaces_the_shuffle():
    n = 8
    rev = GroupDistributedSampler(n, 0, 2, 2, order_fn=lambda epoch, k: torch.arange(k - 1, -1, -1))
    assert take(rev, 2) == [[7, 5], [3, 1]]
    fixed = GroupDistributedSampler(n, 0, 2, 2, order_fn=repeat_first_epoch_order_fn(5))
    assert take(fixed, 2) == take(fixed, 2), "upstream's order repeats every epoch"
    plain = GroupDistributedSampler(n, 0, 2, 2, sampler_seed=5)
    assert plain.batch_at(0, 0) == fixed.batch_at(0, 0)  # epoch 0 agrees
    assert plain.epoch_order(1).tolist() != fixed.epoch_order(1).tolist()  # later epochs do not
    assert GroupDistributedSampler(n, 0, 2, 2, shuffle=False).next_batch() == [0, 2]
    bad = GroupDistributedSampler(n, 0, 2, 2, order_fn=lambda epoch, k: torch.zeros(k, dtype=torch.long))
    with pytest.raises(ValueError, match="not return a permutation"):
        bad.next_batch()


def test_too_few_prompts_and_bad_rank():
    with pytest.raises(ValueError, match="5 prompts cannot fill one iteration of 3 ranks x 2"):
        GroupDistributedSampler(5, 0, 3, 2)
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        GroupDistributedSampler(10, 2, 2, 1)
