"""Sequence parallelism (fastvideo.distributed.sequence_parallel) for the current library line's
families on 2 gloo ranks (Wan too: its video tokens): each tiny transformer with its family's plan at sp = 2 against the stock
diffusers forward and backward in one process (output and every parameter's gradient to 1e-5),
unwrapped and under FSDP with activation checkpointing. The inputs exercise what each family's
split must get right: Z-Image's padded image tokens (20 real of 32) and captions of unequal length
(its key-padding mask); FLUX.2 [klein] and [dev]: 24 image tokens on a 4 x 6 grid (RoPE rows that
differ by row and column) next to 7 replicated text tokens; Qwen-Image: the same grid through
img_shapes' RoPE and a text mask that drops 4 of one sample's 9 tokens; Qwen-Image-Edit: 15 generated
tokens then 9 source tokens (two img_shapes entries) split together, the generated ones the output."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed

from fastvideo.distributed import fsdp, sequence_parallel
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "the current line's families (Z-Image, FLUX.2, Qwen-Image, Qwen-Image-Edit)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")


def _awake(model, seed: int = 1):
    from fastvideo.tools.tiny_builder import wake_zero_projections

    wake_zero_projections(model, seed)
    return model


# ---------------------------------------------------------------- Z-Image


def _zimage_transformer():
    from diffusers import ZImageTransformer2DModel

    from fastvideo.tools.make_tiny_zimage import transformer_config

    torch.manual_seed(0)
    model = ZImageTransformer2DModel.from_config(transformer_config())
    with torch.no_grad():
        for token in (model.x_pad_token, model.cap_pad_token):
            token.normal_(0.0, 0.5)
    return _awake(model)


def _zimage_inputs(seed: int) -> dict:
    """Two samples of a 10 x 8 latent (20 image tokens, padded to 32) with captions of 5 and 37
    tokens (padded to 32 and 64: the batch's key-padding mask)."""
    from fastvideo.tools.make_tiny_zimage import transformer_config

    c = transformer_config()
    g = torch.Generator().manual_seed(1000 + seed)
    return {"x": [torch.randn(c["in_channels"], 1, 10, 8, generator=g) for _ in range(2)],
            "t": torch.rand(2, generator=g),
            "cap_feats": [torch.randn(n, c["cap_feat_dim"], generator=g) for n in (5, 37)],
            "return_dict": False}


def _zimage_output(out) -> torch.Tensor:
    return torch.stack(list(out[0]))


# ---------------------------------------------------------------- FLUX.2 [klein] and [dev]


def _flux2_transformer(dev: bool = False):
    from diffusers import Flux2Transformer2DModel

    from fastvideo.tools.make_tiny_flux2 import transformer_config

    torch.manual_seed(0)
    return _awake(Flux2Transformer2DModel.from_config(transformer_config(dev)))


def _flux2_inputs(seed: int, dev: bool = False) -> dict:
    """Two samples of a 4 x 6 token grid (24 image tokens; RoPE rows that differ by row and
    column) and 7 text tokens (an odd count: the text is replicated, not split)."""
    from fastvideo.models.flux2.components import image_ids, text_ids
    from fastvideo.tools.make_tiny_flux2 import transformer_config

    c = transformer_config(dev)
    g = torch.Generator().manual_seed(1000 + seed)
    return {"hidden_states": torch.randn(2, 24, c["in_channels"], generator=g),
            "encoder_hidden_states": torch.randn(2, 7, c["joint_attention_dim"], generator=g),
            "timestep": torch.rand(2, generator=g), "img_ids": image_ids(4, 6), "txt_ids": text_ids(7),
            "guidance": torch.full((2,), 4.0) if dev else None, "return_dict": False}


def _first(out) -> torch.Tensor:
    return out[0]


# ---------------------------------------------------------------- Qwen-Image


def _qwen_image_transformer():
    from diffusers import QwenImageTransformer2DModel

    from fastvideo.tools.make_tiny_qwen_image import transformer_config

    torch.manual_seed(0)
    return _awake(QwenImageTransformer2DModel.from_config(transformer_config()))


def _qwen_image_inputs(seed: int) -> dict:
    """Two samples of a 4 x 6 token grid (img_shapes' RoPE) and 9 text tokens, the second sample's
    last 4 masked out (the text's key-padding mask)."""
    from fastvideo.tools.make_tiny_qwen_image import transformer_config

    c = transformer_config()
    g = torch.Generator().manual_seed(1000 + seed)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    return {"hidden_states": torch.randn(2, 24, c["in_channels"], generator=g),
            "encoder_hidden_states": torch.randn(2, 9, c["joint_attention_dim"], generator=g),
            "encoder_hidden_states_mask": mask, "timestep": torch.rand(2, generator=g),
            "img_shapes": [[(1, 4, 6)]] * 2, "return_dict": False}


def _qwen_image_edit_inputs(seed: int) -> dict:
    """Qwen-Image-Edit's stream: 15 generated tokens on a 3 x 5 grid (odd: they alone would not split),
    then 9 source tokens on a 3 x 3 grid (img_shapes' second entry, its own RoPE table), 24 in all;
    the rank boundary falls inside the generated tokens, and rank 1 holds both kinds."""
    inputs = _qwen_image_inputs(seed)
    g = torch.Generator().manual_seed(2000 + seed)
    source = torch.randn(2, 9, inputs["hidden_states"].shape[2], generator=g)
    return {**inputs, "hidden_states": torch.cat([inputs["hidden_states"][:, :15], source], 1),
            "img_shapes": [[(1, 3, 5), (1, 3, 3)]] * 2}


def _qwen_image_edit_2511_transformer():
    """Qwen-Image-Edit-2511's zero_cond_t: the source tokens modulated with timestep 0 (modulate_index)."""
    from diffusers import QwenImageTransformer2DModel

    from fastvideo.tools.make_tiny_qwen_image import transformer_config

    torch.manual_seed(0)
    return _awake(QwenImageTransformer2DModel.from_config({**transformer_config(), "zero_cond_t": True}))


def _generated(out) -> torch.Tensor:
    return out[0][:, :15]


# ---------------------------------------------------------------- Wan2.1-T2V and Wan2.2-TI2V


def _wan_transformer(variant: str = "t2v"):
    from diffusers import WanTransformer3DModel

    from fastvideo.tools.make_tiny_wan import transformer_config

    from fastvideo.models.wan.components import keep_time_dtype

    torch.manual_seed(0)
    model = _awake(WanTransformer3DModel.from_config(transformer_config(variant)))
    keep_time_dtype(model)  # as the family's loader: FSDP flattens the time embedder's parameters away
    return model


def _wan_inputs(seed: int, variant: str = "t2v") -> dict:
    """Two clips of 3 latent frames x 4 x 6 cells: 3 x 2 x 3 = 18 tokens after the 1x2x2 patches, so
    the rank boundary (token 9) falls inside the second frame; 7 umT5 tokens; Wan2.2-TI2V: a timestep
    per token (expand_timesteps), the first frame's at 0 as its image-conditioned frame would be."""
    from fastvideo.tools.make_tiny_wan import transformer_config

    c = transformer_config(variant)
    g = torch.Generator().manual_seed(1000 + seed)
    t = 1000 * torch.rand(2, generator=g)
    if variant == "ti2v":
        t = torch.cat([torch.zeros(2, 6), t[:, None].expand(2, 12)], dim=1)
    return {"hidden_states": torch.randn(2, c["in_channels"], 3, 4, 6, generator=g), "timestep": t,
            "encoder_hidden_states": torch.randn(2, 7, c["text_dim"], generator=g), "return_dict": False}


FAMILIES = {
    "zimage": (_zimage_transformer, _zimage_inputs, _zimage_output),
    "flux2": (_flux2_transformer, _flux2_inputs, _first),
    "flux2_dev": (lambda: _flux2_transformer(True), lambda seed: _flux2_inputs(seed, True), _first),
    "qwen_image": (_qwen_image_transformer, _qwen_image_inputs, _first),
    "qwen_image_edit": (_qwen_image_transformer, _qwen_image_edit_inputs, _generated),
    "qwen_image_edit_2511": (_qwen_image_edit_2511_transformer, _qwen_image_edit_inputs, _generated),
    "wan": (_wan_transformer, _wan_inputs, _first),
    "wan_ti2v": (lambda: _wan_transformer("ti2v"), lambda seed: _wan_inputs(seed, "ti2v"), _first),
}
SWAPPED = {"zimage": 3, "flux2": 4, "flux2_dev": 4, "qwen_image": 2, "qwen_image_edit": 2, "qwen_image_edit_2511": 2,
           "wan": 2, "wan_ti2v": 2}  # Wan: each block's self-attention (its cross-attention needs no exchange); Z-Image: the noise refiner's 1 + the main layers' 2 (the context refiner keeps its own)


def _family(name: str):
    from fastvideo.models.registry import family_factory

    return family_factory(name.removesuffix("_dev").removesuffix("_2511").removesuffix("_ti2v"))()


def _loss(out: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    return (out * w).sum() + out.square().mean()


def _close(got: torch.Tensor, want: torch.Tensor, what: str, read_through: float = 0.0) -> None:
    """1e-5 relative, elementwise and to the tensor's scale: a gradient element that is a sum of
    terms cancelling to ~0 keeps the rounding of its terms (fp32: ~1e-7 of the largest).
    read_through: the largest weight a gradient was read through (FSDP's, as weight before minus
    after an SGD step: two fp32 roundings of the weight)."""
    atol = 1e-5 * float(want.abs().max()) + 1e-8 + 2.5e-7 * read_through
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-5, msg=what)


def _reference(name: str):
    build, inputs, output = FAMILIES[name]
    model = build()
    out = output(model(**inputs(0)))
    _loss(out).backward()
    weights = {n: float(p.detach().abs().max()) for n, p in model.named_parameters()}
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, weights


def _transformer(info, name: str, wrap: str | None):
    dims = ParallelDims.build(info.world_size, info.rank, sp=info.world_size).init_groups()
    shard = sequence_parallel.sequence_shard(dims)
    build, inputs, output = FAMILIES[name]
    model = build()
    if wrap is not None:
        model = fsdp.wrap_model(model, wrap, info.device, gradient_checkpointing=True,
                                block_classes=_family(name).block_classes())
    swapped = sequence_parallel.install(model, _family(name).sequence_parallel_plan(), shard)
    out = output(model(**inputs(0)))
    _loss(out).backward()
    if wrap is None:
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, swapped
    from test_fsdp_wrap import implied_sgd_grads

    return out.detach(), implied_sgd_grads(model), swapped


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_transformer_with_the_family_plan_equals_one_process(name):
    """Every rank's output equals the one-process forward; the ranks' gradients average to the
    one-process gradient; under FSDP with activation checkpointing the gradient FSDP leaves is it."""
    want_out, want_grads, weights = _reference(name)
    plain = run_distributed(_transformer, name, None)
    for out, _, swapped in plain:
        _close(out, want_out, "output")
        assert swapped == SWAPPED[name]
    assert want_grads
    for n, want in want_grads.items():
        got = sum(r[1][n] for r in plain) / len(plain)
        _close(got, want, n)
    wrapped = run_distributed(_transformer, name, "full")
    _close(wrapped[0][0], want_out, "output")
    for n, want in want_grads.items():
        _close(wrapped[0][1][n], want, n, read_through=weights[n])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plans_read_the_head_count_sp_must_divide(name):
    """Each plan names its config's head count (Z-Image: n_heads), so --sp_size 4 against the tiny
    models' 2 heads is refused in one line before anything loads."""
    from fastvideo.errors import ConfigError

    plan = _family(name).sequence_parallel_plan()
    config = dict(FAMILIES[name][0]().config)
    assert config[plan.heads_key] == 2
    with pytest.raises(ConfigError, match="does not divide the transformer's 2 attention heads") as err:
        sequence_parallel.check_sizes(4, 4, config[plan.heads_key], 64, name.removesuffix("_dev"), True)
    assert "\n" not in str(err.value)


def _counted_forward(info, name: str = "zimage"):
    from fastvideo.distributed import comm_count

    dims = ParallelDims.build(info.world_size, info.rank, sp=info.world_size).init_groups()
    build, inputs, _ = FAMILIES[name]
    model = build()
    sequence_parallel.install(model, _family(name).sequence_parallel_plan(), sequence_parallel.sequence_shard(dims))
    comm_count.install()
    comm_count.reset()
    with torch.no_grad(), comm_count.phase("rollout"):
        model(**inputs(0))
    return comm_count.metrics()


def test_zimage_cost_model_exchange_bytes_are_what_a_forward_sends():
    """perf.sequence_parallel's all-to-all and gather bytes per forward for Z-Image (its n_heads / dim
    config, the image tokens padded to 32, the noise refiner image-only) equal what the tiny
    transformer's forward issues at sp = 2, fp32: 2 samples of 80 x 64 pixels (10 x 8 latents: 20
    tokens, padded to 32) and captions padded to 64 in the main layers."""
    from fastvideo.perf.sequence_parallel import attention_layers, family_exchange_bytes

    m = run_distributed(_counted_forward)[0]
    family = _family("zimage")
    config = dict(_zimage_transformer().config)
    layers = attention_layers(config, family)
    assert layers == (2, 1)  # the main layers joint, the noise refiner image-only
    a2a, gathered = family_exchange_bytes(config, family, 80, 64, 64, 2, 2, 4)
    assert m["comm/rollout/all_to_all_bytes"] == a2a and m["comm/rollout/all_to_all_calls"] == 2 * sum(layers)
    assert m["comm/rollout/all_gather_bytes"] == gathered and m["comm/rollout/all_gather_calls"] == 1


def test_wan_cost_model_exchange_bytes_are_what_a_forward_sends():
    """The same for Wan2.1-T2V: 9-frame clips (3 latent frames) at 32 x 48 pixels (4 x 6 cells) are
    the 18 tokens _wan_inputs splits; only the self-attention exchanges (2 all-to-alls a block), the
    gather is the blocks' output (heads x head dimension wide), 7 text tokens never sent."""
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.perf.sequence_parallel import attention_layers, family_exchange_bytes

    m = run_distributed(_counted_forward, "wan")[0]
    family = WanFamily(num_frames=9)
    config = dict(_wan_transformer().config)
    layers = attention_layers(config, family)
    assert layers == (0, 2) and family.sequence_tokens(32, 48, config) == 18
    a2a, gathered = family_exchange_bytes(config, family, 32, 48, 7, 2, 2, 4)
    assert m["comm/rollout/all_to_all_bytes"] == a2a and m["comm/rollout/all_to_all_calls"] == 2 * sum(layers)
    assert m["comm/rollout/all_gather_bytes"] == gathered and m["comm/rollout/all_gather_calls"] == 1


@pytest.mark.parametrize("name", ["zimage", "flux2", "qwen_image", "qwen_image_edit"])
def test_cost_model_sp_table_prints_for_the_family(name, capsys, monkeypatch):
    """cost_model --sp_table for the current line's families with a plan: rows for sp 1, 2, 4, the
    all-to-all bytes 0 at sp 1 and falling with sp."""
    from fastvideo.tools import cost_model

    cost_model.main(["--sp_table", "--model_family", name, "--h", "512", "--w", "512", "--text_tokens", "64"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    a2a = [float(r[3]) for r in rows]
    assert a2a[0] == 0 < a2a[2] < a2a[1]
