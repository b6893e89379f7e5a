"""EMA: closed-form arithmetic, swap-in, state dicts, and sharded (FSDP, 2 ranks) == unsharded."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo.distributed import fsdp
from fastvideo.training.ema import EMA

DECAY = 0.9


def param_sequence(model, k: int) -> list[dict[str, torch.Tensor]]:
    """k full state dicts of fresh random weights (same names/shapes as ``model``)."""
    g = torch.Generator().manual_seed(123)
    return [{n: torch.randn(p.shape, generator=g) for n, p in model.state_dict().items()} for _ in range(k)]


def closed_form(start: dict, seq: list[dict], decay: float) -> dict[str, torch.Tensor]:
    """After k updates: decay^k * s0 + (1 - decay) * sum_i decay^(k-i) * p_i, in float64."""
    k = len(seq)
    out = {}
    for name, s0 in start.items():
        acc = decay**k * s0.double()
        for i, p in enumerate(seq, start=1):
            acc = acc + (1 - decay) * decay ** (k - i) * p[name].double()
        out[name] = acc
    return out


def test_ema_matches_closed_form_and_swaps_back_exactly():
    model = tiny_transformer()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ema = EMA(model, decay=DECAY)
    seq = param_sequence(model, 5)
    for weights in seq:
        model.load_state_dict(weights)
        ema.update(model)
    assert ema.num_updates == 5
    full = ema.full_state_dict(model)
    expected = closed_form(start, seq, DECAY)
    for name in expected:
        torch.testing.assert_close(full[name].double(), expected[name], atol=1e-6, rtol=1e-6, msg=name)

    # Swapped in: the model computes with the EMA weights; afterwards the training weights return bit for bit.
    reference = tiny_transformer()
    reference.load_state_dict(full)
    with torch.no_grad():
        want = reference(**tiny_inputs(0))[0]
        with ema.swapped_in(model):
            got = model(**tiny_inputs(0))[0]
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for name, value in model.state_dict().items():
        assert torch.equal(value, seq[-1][name]), name


def test_state_dict_round_trip_and_mismatch_errors():
    model = tiny_transformer()
    ema = EMA(model, decay=DECAY)
    model.load_state_dict(param_sequence(model, 1)[0])
    ema.update()
    other = EMA(tiny_transformer(), decay=0.5)
    other.load_state_dict(ema.state_dict())
    assert other.decay == DECAY and other.num_updates == 1
    assert all(torch.equal(a, b) for a, b in zip(other.shadow, ema.shadow))

    with pytest.raises(ValueError, match="local shards"):
        EMA(torch.nn.Linear(3, 3), decay=DECAY).load_state_dict(ema.state_dict())
    with pytest.raises(ValueError, match="different parameters"):
        ema.update(tiny_transformer())
    with pytest.raises(ValueError, match="must be in \\(0, 1\\)"):
        EMA(model, decay=1.0)


def test_bf16_weights_keep_a_float32_shadow():
    """With decay 0.995 a bf16 shadow would not move at all for small steps."""
    model = torch.nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema = EMA(model, decay=0.995)
    with torch.no_grad():
        model.weight.fill_(1.5)
    ema.update(model)
    assert ema.shadow[0].dtype == torch.float32
    torch.testing.assert_close(ema.shadow[0], torch.full((4, 4), 1.0025))


def _sharded_vs_unsharded(info):
    ref = tiny_transformer()
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    model = fsdp.wrap_model(tiny_transformer(), "full", info.device)
    ema_ref, ema = EMA(ref, DECAY), EMA(model, DECAY)
    local = sum(s.numel() for s in ema.shadow)
    total = sum(p.numel() for p in ref.parameters())
    assert local < total  # really sharded: this rank shadows only its part
    seq = param_sequence(ref, 4)
    for weights in seq:
        ref.load_state_dict(weights)
        fsdp.load_full_model_state_dict(model, {k: v.clone() for k, v in weights.items()})
        ema_ref.update(ref)
        ema.update(model)
    sharded = ema.full_state_dict(model)  # collective
    with torch.no_grad():
        model(**tiny_inputs(info.rank))  # FSDP1 now keeps the root's gathered training weights
    with torch.no_grad(), ema.swapped_in(model):
        out = model(**tiny_inputs(info.rank))[0]
    after = fsdp.full_model_state_dict(model)  # training weights restored
    if info.rank == 0:
        unsharded = ema_ref.full_state_dict(ref)
        expected = closed_form(start, seq, DECAY)
        assert set(sharded) == set(unsharded)
        for name in unsharded:
            torch.testing.assert_close(sharded[name], unsharded[name], atol=1e-7, rtol=0, msg=name)
            torch.testing.assert_close(sharded[name].double(), expected[name], atol=1e-6, rtol=1e-6, msg=name)
            assert torch.equal(after[name], seq[-1][name]), name
    else:
        assert sharded == {}
    with torch.no_grad(), ema_ref.swapped_in(ref):
        torch.testing.assert_close(out, ref(**tiny_inputs(info.rank))[0], atol=1e-6, rtol=0)

    # A full EMA state dict loads back into the sharded EMA (any world size), shard for shard.
    fresh = EMA(model, DECAY)
    fresh.load_full_state_dict(model, sharded if info.rank == 0 else {}, num_updates=4)
    assert all(torch.equal(a, b) for a, b in zip(fresh.shadow, ema.shadow))
    return True


def test_sharded_ema_equals_unsharded():
    assert run_distributed(_sharded_vs_unsharded) == [True, True]


def test_trainer_updates_the_ema_once_per_iteration(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """Two optimizer steps per iteration (4 micro-batches, accumulation 2): the trainer's EMA is the
    closed form over the weights after each iteration from --ema_start_step on (upstream updates its
    EMA once per train_one_step), not over the weights after each optimizer step."""
    from helpers import single_process_trainer, train_args

    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "ema", use_ema=True, ema_decay=DECAY,
                      ema_start_step=2, num_generations=4, rollout_batch_size=4, train_micro_batch_size=1,
                      gradient_accumulation_steps=2, timestep_fraction=0.34, max_train_steps=3,
                      save_images_every=0, checkpointing_steps=100, fsdp_sharding_strategy="none")
    trainer = single_process_trainer(argv, monkeypatch)
    start = {k: v.clone() for k, v in fsdp.full_model_state_dict(trainer.model).items()}
    after = []
    for _ in range(3):
        record = trainer.run_iteration()
        assert record["optimizer_steps"] == 2
        after.append({k: v.clone() for k, v in fsdp.full_model_state_dict(trainer.model).items()})
    expected = closed_form(start, after[1:], DECAY)  # iteration 1 < ema_start_step 2: not averaged
    got = trainer.ema.full_state_dict(trainer.model)
    assert trainer.ema.num_updates == 2
    for name, value in expected.items():
        torch.testing.assert_close(got[name].double(), value, rtol=1e-6, atol=1e-7, msg=name)
