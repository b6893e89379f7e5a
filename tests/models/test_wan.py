"""The Wan family against diffusers' own WanPipeline (nobody here wrote it): the tiny folders load in
the stock pipeline offline, umT5 prompt encoding equals WanPipeline.encode_prompt, the ODE rollout on
the stock flow-match Euler scheduler's sigmas equals the pipeline's latents and decoded frames (with
CFG and the negative prompt, and without), for Wan2.1-T2V and Wan2.2-TI2V-5B (its per-token timesteps
and 48-channel VAE), 5 frames at tiny sizes; --num_frames' rule. The current library line only
(skipped on the recipe line, saying so: diffusers 0.32 has no Wan)."""

from __future__ import annotations

import json

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Wan (diffusers' WanPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ, STEPS, FRAMES, SCALE = 16, 3, 5, 5.0
SIZE = {"t2v": 32, "ti2v": 64}  # pixels: a 4x4 latent grid under each VAE (8x, 16x)


def _pipe(folder):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = WanPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    stock = pipe.scheduler
    assert type(stock).__name__ == "UniPCMultistepScheduler" and stock.config.use_flow_sigmas
    # the flow-match Euler scheduler at the folder's shift: the rollout's ODE step is its step
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=stock.config.flow_shift)
    return pipe


@pytest.fixture(scope="module")
def pipes(tiny_wan_dir, tiny_wan_ti2v_dir):
    return {"t2v": (tiny_wan_dir, _pipe(tiny_wan_dir)), "ti2v": (tiny_wan_ti2v_dir, _pipe(tiny_wan_ti2v_dir))}


def test_tiny_folders_load_in_the_stock_pipeline_with_the_wan_layouts(pipes):
    from fastvideo.models.registry import family_of_folder

    (t2v_dir, t2v), (ti2v_dir, ti2v) = pipes["t2v"], pipes["ti2v"]
    assert type(t2v.text_encoder).__name__ == "UMT5EncoderModel" and type(t2v.vae).__name__ == "AutoencoderKLWan"
    assert (t2v.vae.config.z_dim, t2v.vae_scale_factor_spatial, t2v.config.expand_timesteps) == (16, 8, False)
    assert (ti2v.vae.config.z_dim, ti2v.vae_scale_factor_spatial, ti2v.config.expand_timesteps) == (48, 16, True)
    assert ti2v.transformer.config.in_channels == 48 and ti2v.vae.config.is_residual
    assert t2v.transformer.config.text_dim == t2v.text_encoder.config.d_model
    assert family_of_folder(t2v_dir) == family_of_folder(ti2v_dir) == "wan"
    video = t2v(prompt="a cube", height=32, width=32, num_frames=FRAMES, num_inference_steps=1,
                max_sequence_length=SEQ, output_type="pt").frames
    assert video.shape == (1, FRAMES, 3, 32, 32)


def _family(folder, scale):
    from fastvideo.models.wan.family import WanFamily

    family = WanFamily(guidance_scale=scale, num_frames=FRAMES)
    family.check_folder(folder)
    return family


def test_prompt_encoding_equals_the_pipeline(pipes):
    """umT5's last hidden state, zero past each prompt's tokens, as WanPipeline.encode_prompt (with its
    negative ""), cleaned the pipeline's way (collapsed whitespace, HTML entities)."""
    folder, pipe = pipes["t2v"]
    family = _family(folder, SCALE)
    prompts = [*PROMPTS, "  a   cat &amp; a dog  "]
    seq = 48  # longer than each prompt (the tiny tokenizer spells words letter by letter)
    cond = family.encode_prompts(family.load_text_encoders(folder), prompts, seq)
    ref, neg = pipe.encode_prompt(prompts, negative_prompt="", max_sequence_length=seq)
    assert cond["prompt_embeds"].shape == ref.shape == (3, seq, 32)
    torch.testing.assert_close(cond["prompt_embeds"], ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(cond["neg_prompt_embeds"], neg[0], rtol=0, atol=1e-5)
    lengths = (cond["prompt_embeds"].abs().sum(-1) > 0).sum(-1)
    assert lengths[0] > lengths[1] and int(lengths.max()) < seq  # zero past each prompt's tokens


def _rollout(family, pipe, cond, size):
    from fastvideo.sampling.plan import ODE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    pipe.scheduler.set_timesteps(STEPS)
    sigmas = pipe.scheduler.sigmas.float().clone()  # the stock scheduler's, at the folder's shift
    cfg = RolloutConfig(height=size, width=size, sampling_steps=STEPS, eta=0.0, shift=1.0, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = SamplingPlan(sigmas=sigmas, kinds=(ODE,) * STEPS, trainable=(), num_trained=0)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(3), 1, "cpu",
                   plan=plan)


@pytest.mark.parametrize("variant, scale", [("t2v", SCALE), ("t2v", 1.0), ("ti2v", SCALE)])
def test_ode_rollout_equals_the_pipeline(pipes, variant, scale):
    """The ODE rollout equals WanPipeline's latents (output_type latent) for the same noise on the same
    sigmas, with CFG 5.0 and negative prompt "" and without (1.0), and its decoded frames [B, F, 3, H, W]
    (output_type pt). Tolerance 1e-5 relative (fp32); measured on the tiny models, 5 frames, 3 steps:
    t2v 5.2e-7 with CFG (one batched [cond; uncond] call), 0.0 without; ti2v 0.0. Wan2.2-TI2V's
    transformer gets a timestep per latent token (expand_timesteps), Wan2.1's one per sample."""
    from fastvideo.models.latents import from_tokens

    folder, pipe = pipes[variant]
    family, size = _family(folder, scale), SIZE[variant]
    assert family.expand_timesteps is (variant == "ti2v")
    cond = family.encode_prompts(family.load_text_encoders(folder), PROMPTS, SEQ)
    shapes = []
    hook = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["timestep"].shape)),
                                                      with_kwargs=True)
    try:
        traj = _rollout(family, pipe, cond, size)
    finally:
        hook.remove()
    grid = traj.layout["grid"]
    channels = 48 if variant == "ti2v" else 16
    assert grid == (2, 4, 4) and traj.layout.tokens == (32, channels)
    rows = 2 * (2 if scale > 1 else 1)
    assert shapes[0] == ((rows, 2 * 2 * 2) if variant == "ti2v" else (rows,))  # f (h/2) (w/2) tokens
    noise = from_tokens(traj.latents[:, 0], *grid)
    neg = "" if scale > 1 else None
    kwargs = dict(prompt=list(PROMPTS), negative_prompt=neg, guidance_scale=scale, height=size, width=size,
                  num_frames=FRAMES, num_inference_steps=STEPS, max_sequence_length=SEQ)
    ref = pipe(**kwargs, latents=noise.clone(), output_type="latent").frames
    ours = from_tokens(traj.latents[:, -1], *grid)
    assert ours.shape == ref.shape == (2, channels, 2, 4, 4)
    assert not torch.allclose(ours, noise, atol=1e-1)  # it moved
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"{variant} guidance {scale}: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    frames = pipe(**kwargs, latents=noise.clone(), output_type="pt").frames
    assert traj.images.shape == frames.shape == (2, FRAMES, 3, size, size)
    torch.testing.assert_close(traj.images, frames, rtol=0, atol=1e-5)
    assert float((traj.images[:, 0] - traj.images[:, -1]).abs().max()) > 0  # frames differ: a clip


def test_num_frames_must_be_4k_plus_1_in_one_line():
    from fastvideo.errors import ConfigError
    from fastvideo.models.wan.components import latent_frames
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.models.wan.settings import WanSettings

    assert [latent_frames(f) for f in (1, 5, 9, 81)] == [1, 2, 3, 21]
    assert WanFamily(num_frames=1).num_frames == 1 and WanFamily().num_frames == 81  # WanPipeline's default
    with pytest.raises(ConfigError) as exc:
        WanSettings(num_frames=6).check()
    assert str(exc.value).count("\n") == 0 and "4k+1" in str(exc.value) and "use 5 or 9" in str(exc.value)
    with pytest.raises(ValueError):
        WanFamily(num_frames=0)


def test_the_ti2v_folder_says_expand_timesteps(tiny_wan_ti2v_dir, tiny_wan_dir):
    from fastvideo.models.wan.components import expand_timesteps
    from fastvideo.models.wan.family import WanFamily

    index = json.loads((tiny_wan_ti2v_dir / "model_index.json").read_text())
    assert index["expand_timesteps"] is True and expand_timesteps(tiny_wan_ti2v_dir)
    assert not expand_timesteps(tiny_wan_dir)
    t2v, ti2v = WanFamily(num_frames=5), WanFamily(num_frames=5)  # the clips' frame rates follow the folder
    t2v.check_folder(tiny_wan_dir)
    ti2v.check_folder(tiny_wan_ti2v_dir)
    assert (t2v.video_fps, ti2v.video_fps) == (16, 24)


def _meta_as_real(inputs: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    return {k: (torch.rand(v.shape, generator=g) * 999 if k == "timestep" else
                torch.randn(v.shape, generator=g) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


@pytest.mark.parametrize("variant", ["t2v", "ti2v"])
def test_transformer_flops_match_flop_counter(pipes, variant):
    """The analytic count (models/wan/flops.py) equals FlopCounterMode's on the tiny transformer, forward
    and forward + backward, with Wan2.2-TI2V's per-token timesteps; CFG doubles it. Measured: exact."""
    from fastvideo.perf.flops import count_flops

    folder, pipe = pipes[variant]
    family, model = _family(folder, 1.0), pipe.transformer
    config = dict(model.config)
    layout = family.layout(SIZE[variant], SIZE[variant], pipe.vae, model)
    for text_tokens in (7, SEQ):
        inputs = _meta_as_real(family.meta_inputs(config, 2, layout, text_tokens, torch.float32))
        with torch.no_grad():
            fwd = count_flops(lambda: model(**inputs))
        fb = count_flops(lambda: model(**inputs)[0].square().mean().backward())
        model.zero_grad(set_to_none=True)
        counts = family.transformer_flops(config, layout.tokens[0], text_tokens, 2)
        assert (counts["forward"], counts["forward"] + counts["backward"]) == (fwd, fb)
    guided = _family(folder, SCALE).transformer_flops(config, layout.tokens[0], SEQ, 2)
    assert guided["forward"] == 2 * family.transformer_flops(config, layout.tokens[0], SEQ, 2)["forward"]


def test_the_cost_model_sizes_the_published_wan_models_at_a_clip_length():
    """--model wan2.1-t2v-1.3b | wan2.2-ti2v-5b | wan2.1-t2v-14b (models/wan/reference.py) and --num_frames:
    the meta transformers have the published sizes, the layout the clip's latent frames, the VAE decode a peak."""
    from fastvideo.errors import ConfigError
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.perf.memory import decode_peak
    from fastvideo.tools.cost_model import resolve_model, set_num_frames

    family = WanFamily(num_frames=5)
    set_num_frames(family, 81)
    sizes = {}
    for name in ("wan2.1-t2v-1.3b", "wan2.2-ti2v-5b", "wan2.1-t2v-14b"):
        config, vae_config, _ = resolve_model(name, family)
        sizes[name] = sum(p.numel() for p in family.meta_transformer(config, torch.bfloat16).parameters())
        layout = family.nominal_layout(480, 832, config)
        cell = 16 if name == "wan2.2-ti2v-5b" else 8
        assert layout["grid"] == (21, 480 // cell, 832 // cell)  # 81 frames: 21 latent frames
    assert round(sizes["wan2.1-t2v-1.3b"] / 1e9, 2) == 1.42 and round(sizes["wan2.2-ti2v-5b"] / 1e9, 2) == 5.0
    assert round(sizes["wan2.1-t2v-14b"] / 1e9, 1) == 14.3
    config, vae_config, _ = resolve_model("wan2.1-t2v-1.3b", family)
    set_num_frames(family, 5)
    short = decode_peak(*family.meta_vae(vae_config, 1, family.nominal_layout(64, 64, config), torch.bfloat16))
    set_num_frames(family, 9)
    longer = decode_peak(*family.meta_vae(vae_config, 1, family.nominal_layout(64, 64, config), torch.bfloat16))
    assert short[0] == longer[0] > 1e8 and longer[1] > short[1] > 0
    with pytest.raises(ConfigError, match="--num_frames 8: Wan's VAE takes 4k\\+1 frames"):
        set_num_frames(family, 8)


@pytest.mark.parametrize("variant", ["t2v", "ti2v"])
def test_npu_adapter_computes_the_stock_velocity_without_float64(pipes, variant):
    """wan.npu's adapter (the q/k RMS norms fused, the attention through attention_bnsd) run on the
    CPU: the transformer's output equals the stock model's, and its forward, RoPE included, issues no
    float64 or complex op."""
    import copy
    import sys
    from pathlib import Path

    from fastvideo.models import npu_ops
    from fastvideo.models.wan import npu as wan_npu

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from float64_guard import NoFloat64OnDevice

    stock = pipes[variant][1].transformer
    adapted = copy.deepcopy(stock)
    layers = stock.config.num_layers
    assert npu_ops.adapt_for_npu(adapted) == 2 * 2 * layers  # q and k norms of self- and cross-attention
    assert wan_npu.adapt_wan_for_npu(adapted) == 2 * layers and wan_npu.adapt_wan_for_npu(adapted) == 0
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, stock.config.in_channels, 2, 4, 4, generator=g)
    text = torch.randn(2, SEQ, stock.config.text_dim, generator=g)
    t = torch.tensor([700.0, 300.0])
    with torch.no_grad():
        ref = stock(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        with NoFloat64OnDevice() as guard:
            ours = adapted(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    assert guard.ops > 50
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_npu_attention_takes_wan21_i2v_image_keys_and_the_fused_kernel(monkeypatch):
    """NpuWanAttnProcessor on a cross-attention with Wan2.1-I2V's image keys (added k/v projections,
    the image tokens before 512 text tokens) equals diffusers' WanAttnProcessor; on the NPU path (the
    stand-in torch_npu) both attentions take the fused kernel."""
    import sys
    from pathlib import Path

    from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor

    from fastvideo.models.wan.npu import NpuWanAttnProcessor

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import npu_stub

    torch.manual_seed(0)
    attn = WanAttention(dim=32, heads=2, dim_head=16, eps=1e-6, added_kv_proj_dim=32, cross_attention_dim_head=16,
                        processor=WanAttnProcessor())
    hidden, context = torch.randn(2, 6, 32), torch.randn(2, 257 + 512, 32)
    with torch.no_grad():
        ref = attn(hidden, encoder_hidden_states=context)
        attn.set_processor(NpuWanAttnProcessor())
        ours = attn(hidden, encoder_hidden_states=context)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    stub = npu_stub.install(monkeypatch)
    with torch.no_grad():
        fused = attn.to(torch.bfloat16)(hidden.bfloat16(), encoder_hidden_states=context.bfloat16())
    assert stub.calls["npu_fusion_attention"] == 2  # the text keys and the image keys
    torch.testing.assert_close(fused.float(), ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("variant", ["t2v", "ti2v"])
def test_the_vae_decode_flops_equal_a_real_decode_and_the_cost_model_prints_them(variant, pipes, capsys):
    """WanFamily.vae_decode_flops (models/video_decode.py: the causal AutoencoderKLWan decoding on meta) equals
    FlopCounterMode around the folder's own VAE decoding a real clip's latents on the CPU, its mid-block
    attention included (Wan2.1's VAE and
    Wan2.2's, patched and residual); `cost_model --model_family wan --model wan2.2-ti2v-5b` then prints its
    table with the decode row = clips x one clip's count (before: KeyError 'block_out_channels', a traceback:
    perf.flops counted every decode as AutoencoderKL's image decoder)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from fastvideo.models.wan.family import WanFamily
    from fastvideo.tools.cost_model import main, resolve_model, set_num_frames

    folder, pipe = pipes[variant]
    family = _family(folder, SCALE)
    config = json.loads((folder / "transformer" / "config.json").read_text())
    vae_config = json.loads((folder / "vae" / "config.json").read_text())
    layout = family.nominal_layout(64, 64, config)
    latents = torch.randn(1, vae_config["z_dim"], *layout["grid"], generator=torch.Generator().manual_seed(0))
    # the math attention (its matmuls counted), as on meta; the CPU's fused kernel has no FLOP formula
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        frames = pipe.vae.decode(latents).sample
    assert frames.shape[2:] == (FRAMES, 64, 64) and counter.get_total_flops() > 0
    assert family.vae_decode_flops(vae_config, config, 64, 64) == counter.get_total_flops()
    main(["--model_family", "wan", "--model", "wan2.2-ti2v-5b", "--num_frames", "81", "--h", "704", "--w", "1280",
          "--world_size", "2", "--num_generations", "2"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("VAE decode"))
    reference = WanFamily(num_frames=5)
    set_num_frames(reference, 81)
    config, vae_config, _ = resolve_model("wan2.2-ti2v-5b", reference)
    one = reference.vae_decode_flops(vae_config, config, 704, 1280)
    assert row.split()[2:4] == ["4", "decodes"] and float(row.split()[4]) == pytest.approx(4 * one, rel=1e-3)
