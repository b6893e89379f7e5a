"""Ulysses sequence parallelism (fastvideo.distributed.sequence_parallel) on 2 gloo ranks against
the one-process computation: the attention exchange against torch's SDPA on all tokens (1e-6, its
gradients too), and the tiny FLUX.1 and SD3.5 transformers with the families' plans against the
stock diffusers forward and backward, unwrapped and under FSDP (1e-5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo.distributed import fsdp, sequence_parallel
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.errors import ConfigError

B, H, TEXT, L, D = 2, 4, 3, 8, 8


def _qkv(text_first: bool, seed: int = 0):
    """q, k, v and a loss weight [B, H, TEXT + L, D]: the text rows first, or last (SD3's order)."""
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(B, H, TEXT + L, D, generator=g) for _ in range(4)]
    if not text_first:
        tensors = [torch.cat([t[:, :, TEXT:], t[:, :, :TEXT]], dim=2) for t in tensors]
    return tensors[:3], tensors[3]


def _shard(info):
    dims = ParallelDims.build(info.world_size, info.rank, sp=info.world_size).init_groups()
    return dims, sequence_parallel.sequence_shard(dims)


def _attention(info, text_first: bool):
    """This rank's output rows and q/k/v gradients of a weighted loss; the text rows' loss weighted
    1/N (every rank holds them), so that the ranks' gradients sum to the one-process gradient."""
    _, shard = _shard(info)
    shard.full_tokens = L
    (q, k, v), w = _qkv(text_first)
    n, s = info.world_size, L // info.world_size
    text = slice(0, TEXT) if text_first else slice(L, L + TEXT)
    image = slice(TEXT + info.rank * s, TEXT + (info.rank + 1) * s) if text_first else \
        slice(info.rank * s, (info.rank + 1) * s)

    def local(t):
        parts = (t[:, :, text], t[:, :, image]) if text_first else (t[:, :, image], t[:, :, text])
        return torch.cat(parts, dim=2).detach().requires_grad_(True)

    lq, lk, lv = local(q), local(k), local(v)
    out = shard.attention(lq, lk, lv, TEXT, text_first, F.scaled_dot_product_attention)
    lw = local(w).detach()
    scale = torch.ones_like(lw)
    if text_first:
        scale[:, :, :TEXT] = 1 / n
    else:
        scale[:, :, -TEXT:] = 1 / n
    (out * lw * scale).sum().backward()
    return out.detach(), lq.grad, lk.grad, lv.grad


@pytest.mark.parametrize("text_first", [True, False], ids=["text-first (FLUX)", "text-last (SD3)"])
def test_ulysses_attention_equals_attention_on_all_tokens(text_first):
    results = run_distributed(_attention, text_first)
    (q, k, v), w = _qkv(text_first)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v)
    (ref * w).sum().backward()
    s = L // 2
    for rank, (out, gq, gk, gv) in enumerate(results):
        rows = list(range(TEXT)) + list(range(TEXT + rank * s, TEXT + (rank + 1) * s)) if text_first else \
            list(range(rank * s, (rank + 1) * s)) + list(range(L, L + TEXT))
        torch.testing.assert_close(out, ref[:, :, rows].detach(), atol=1e-6, rtol=0)
        image_rows = [i for i, r in enumerate(rows) if (r >= TEXT if text_first else r < L)]
        for got, want in ((gq, q.grad), (gk, k.grad), (gv, v.grad)):
            torch.testing.assert_close(got[:, :, image_rows], want[:, :, [rows[i] for i in image_rows]],
                                       atol=1e-6, rtol=0)
    # the text rows' gradient is split over the ranks: their sum is the whole
    text_rows = list(range(TEXT)) if text_first else list(range(L, L + TEXT))
    local_text = list(range(TEXT)) if text_first else list(range(s, s + TEXT))
    for i, want in enumerate((q.grad, k.grad, v.grad)):
        got = sum(r[1 + i][:, :, local_text] for r in results)
        torch.testing.assert_close(got, want[:, :, text_rows], atol=1e-6, rtol=0)


# ---------------------------------------------------------------- whole transformers


def _sd3_transformer():
    from diffusers import SD3Transformer2DModel

    from fastvideo.tools.make_tiny_sd3 import transformer_config

    torch.manual_seed(0)
    model = SD3Transformer2DModel.from_config(transformer_config())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if torch.count_nonzero(p) == 0 and "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _sd3_inputs(seed: int) -> dict:
    from fastvideo.tools.make_tiny_sd3 import transformer_config

    c = transformer_config()
    g = torch.Generator().manual_seed(1000 + seed)
    return {"hidden_states": torch.randn(1, c["in_channels"], 8, 8, generator=g),
            "encoder_hidden_states": torch.randn(1, 5, c["joint_attention_dim"], generator=g),
            "pooled_projections": torch.randn(1, c["pooled_projection_dim"], generator=g),
            "timestep": torch.rand(1, generator=g) * 1000, "return_dict": False}


FAMILIES = {"flux": (tiny_transformer, tiny_inputs), "sd3": (_sd3_transformer, _sd3_inputs)}


def _loss(out: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    return (out * w).sum() + out.square().mean()


def _reference(name: str):
    build, inputs = FAMILIES[name]
    model = build()
    out = model(**inputs(0))[0]
    _loss(out).backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _family(name: str):
    from fastvideo.models.registry import family_factory

    return family_factory(name)()


def _transformer(info, name: str, wrap: str | None):
    """sp = world: the same sample on every rank. Unwrapped: each rank's gradient (their sum over
    N ranks times... the FSDP average is checked wrapped). Wrapped: the full gradient FSDP leaves."""
    dims, shard = _shard(info)
    build, inputs = FAMILIES[name]
    model = build()
    if wrap is not None:
        model = fsdp.wrap_model(model, wrap, info.device, gradient_checkpointing=True,
                                block_classes=_family(name).block_classes())
    swapped = sequence_parallel.install(model, _family(name).sequence_parallel_plan(), shard)
    out = model(**inputs(0))[0]
    _loss(out).backward()
    if wrap is None:
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, swapped
    from test_fsdp_wrap import implied_sgd_grads

    return out.detach(), implied_sgd_grads(model), swapped


@pytest.mark.parametrize("name", ["flux", "sd3"])
def test_transformer_with_the_family_plan_equals_one_process(name):
    """Every rank's output equals the one-process forward; the ranks' gradients average (as FSDP
    and DDP average over the world) to the one-process gradient; under FSDP with activation
    checkpointing (the exchanges run again in the recomputation) the gradient FSDP leaves is it."""
    want_out, want_grads = _reference(name)
    plain = run_distributed(_transformer, name, None)
    for out, _, swapped in plain:
        torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5)
        assert swapped == {"flux": 2, "sd3": 3}[name]  # FLUX: double + single; SD3: 2 joint + 1 dual attention
    for n, want in want_grads.items():
        got = sum(r[1][n] for r in plain) / len(plain)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=n)
    wrapped = run_distributed(_transformer, name, "full")
    torch.testing.assert_close(wrapped[0][0], want_out, atol=1e-6, rtol=1e-5)
    assert set(want_grads) <= set(wrapped[0][1])  # (the state dict adds buffers: SD3's pos_embed table)
    for n, want in want_grads.items():
        torch.testing.assert_close(wrapped[0][1][n], want, atol=1e-6, rtol=1e-5, msg=n)


def _kontext_velocity(model, source_w: int = 4):
    """FLUX.1 Kontext's velocity (models/kontext/components.kontext_velocity) on the tiny FLUX.1:
    16 generated tokens (4 x 4) and 4 x source_w / 2 source tokens (default 8: another shape than
    the generated; ids column 0 = 1)."""
    from fastvideo.models import flux
    from fastvideo.models.kontext.components import kontext_velocity, source_ids

    g = torch.Generator().manual_seed(5)
    cond = {"prompt_embeds": torch.randn(2, 8, 32, generator=g), "pooled": torch.randn(2, 32, generator=g),
            "text_ids": flux.text_ids(8), "image_latents": torch.randn(2, 4 * source_w // 2, 64, generator=g),
            "source_ids": source_ids(8, source_w)}
    x = torch.randn(2, 16, 64, generator=g)
    return kontext_velocity(model, x, torch.tensor(0.7), cond, flux.image_ids(8, 8), 2.5, True)


def _kontext(info):
    _, shard = _shard(info)
    model = tiny_transformer()
    sequence_parallel.install(model, _family("kontext").sequence_parallel_plan(), shard)
    v = _kontext_velocity(model)
    _loss(v).backward()
    return v.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_kontext_generated_and_source_tokens_split_together():
    """Kontext's [generated ; source] sequence split over 2 ranks (the source tokens and their RoPE
    rows included): the generated tokens' velocity and the gradients equal one process's (1e-5)."""
    model = tiny_transformer()
    want = _kontext_velocity(model)
    assert want.shape == (2, 16, 64)
    _loss(want).backward()
    results = run_distributed(_kontext)
    for v, _ in results:
        torch.testing.assert_close(v, want.detach(), atol=1e-6, rtol=1e-5)
    for n, p in model.named_parameters():
        got = sum(r[1][n] for r in results) / len(results)
        torch.testing.assert_close(got, p.grad, atol=1e-6, rtol=1e-5, msg=n)


def test_sizes_refused_in_one_line():
    sequence_parallel.check_sizes(1, 3, 3, 3, "flux", False)  # sp 1: nothing to check
    for args, needle in (((2, 3, 4, 16, "flux", True), "world size 3"), ((2, 4, 3, 16, "flux", True), "3 attention heads"),
                         ((2, 4, 4, 9, "flux", True), "9 image tokens"), ((2, 4, 4, 16, "toy", False), "no sequence")):
        with pytest.raises(ConfigError, match=needle) as err:
            sequence_parallel.check_sizes(*args)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="does not divide the world size 3"):
        ParallelDims.build(3, 0, sp=2)


def _counted_forward(info, name: str):
    from fastvideo.distributed import comm_count

    _, shard = _shard(info)
    build, inputs = FAMILIES[name]
    model = build()
    sequence_parallel.install(model, _family(name).sequence_parallel_plan(), shard)
    comm_count.install()
    comm_count.reset()
    with torch.no_grad(), comm_count.phase("rollout"):
        model(**inputs(0))
    return comm_count.metrics()


@pytest.mark.parametrize("name", ["flux", "sd3"])
def test_cost_model_exchange_bytes_are_what_a_forward_sends(name):
    """perf.sequence_parallel's all-to-all and gather bytes per forward equal the collectives the
    tiny transformer's forward issues (counted by distributed.comm_count), fp32."""
    from fastvideo.perf.sequence_parallel import attention_layers, exchange_bytes

    m = run_distributed(_counted_forward, name)[0]
    family = _family(name)
    config = dict(FAMILIES[name][0]().config)
    inputs = FAMILIES[name][1](0)
    hidden = inputs["hidden_states"]
    tokens = hidden.shape[1] if name == "flux" else (hidden.shape[2] // 2) * (hidden.shape[3] // 2)
    if name == "sd3":  # the split's tokens are pos_embed's patches, what the start-up check and the table count
        assert family.sequence_tokens(hidden.shape[2] * 8, hidden.shape[3] * 8, config) == tokens
    layers = attention_layers(config, family)
    heads, head_dim = family.attention_dims(config)
    channels = family.sequence_channels(config)  # the gathered output's channels per token
    a2a, gathered = exchange_bytes(heads * head_dim, channels, layers, tokens, inputs["encoder_hidden_states"].shape[1],
                                   2, 1, 4)
    assert m["comm/rollout/all_to_all_bytes"] == a2a and m["comm/rollout/all_to_all_calls"] == 2 * sum(layers)
    assert m["comm/rollout/all_gather_bytes"] == gathered and m["comm/rollout/all_gather_calls"] == 1


def test_cost_model_sp_table_on_the_tiny_flux(capsys):
    from fastvideo.models.registry import family_factory
    from fastvideo.perf.sequence_parallel import sp_rows
    from fastvideo.tools import cost_model
    from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config

    cost_model.main(["--sp_table", "--model", "tiny", "--h", "64", "--w", "64", "--text_tokens", "8"])
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()] == \
        ["1", "2", "4"]
    rows = sp_rows(transformer_config(PRESETS["tiny"]), family_factory("flux")(), 64, 64, 8)
    assert rows[0].all_to_all_bytes_per_forward == 0 < rows[2].all_to_all_bytes_per_forward < \
        rows[1].all_to_all_bytes_per_forward
    assert rows[0].train_activation_bytes > rows[1].train_activation_bytes > rows[2].train_activation_bytes
    assert rows[0].rollout_activation_bytes > rows[1].rollout_activation_bytes > rows[2].rollout_activation_bytes
    cost_model.main(["--sp_table", "--model", "tiny", "--h", "64", "--w", "64", "--text_tokens", "8", "--sp_sizes", "1,4"])
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()] == \
        ["1", "4"]
    with pytest.raises(SystemExit) as exc:  # a size that is not a positive integer: one line, exit 2
        cost_model.main(["--sp_table", "--model", "tiny", "--sp_sizes", "1,0"])
    assert exc.value.code == 2 and "positive integers" in capsys.readouterr().err


def _kontext_counted(info):
    from fastvideo.distributed import comm_count

    _, shard = _shard(info)
    model = tiny_transformer()
    sequence_parallel.install(model, _family("kontext").sequence_parallel_plan(), shard)
    comm_count.install()
    comm_count.reset()
    with torch.no_grad(), comm_count.phase("rollout"):
        _kontext_velocity(model, source_w=8)  # a source of the target's 16 tokens, as the cost model assumes
    return comm_count.metrics()


def test_cost_model_kontext_exchanges_count_the_source_tokens():
    """--sp_table's Kontext bytes (64 x 64: 16 generated tokens, a source of the target's size: 16
    more) equal what a Kontext forward at sp = 2 sends; the generated tokens alone would give less."""
    from fastvideo.perf.sequence_parallel import attention_layers, exchange_bytes, family_exchange_bytes

    m = run_distributed(_kontext_counted)[0]
    family = _family("kontext")
    config = dict(tiny_transformer().config)
    assert family.cost_sequence_tokens(64, 64, config) == 32 and family.sequence_tokens(64, 64, config) == 16
    a2a, gathered = family_exchange_bytes(config, family, 64, 64, 8, 2, 2, 4)
    assert m["comm/rollout/all_to_all_bytes"] == a2a and m["comm/rollout/all_gather_bytes"] == gathered
    heads, head_dim = family.attention_dims(config)
    generated_only = exchange_bytes(heads * head_dim, family.sequence_channels(config),
                                    attention_layers(config, family), 16, 8, 2, 2, 4)
    assert generated_only[0] < a2a and generated_only[1] < gathered
