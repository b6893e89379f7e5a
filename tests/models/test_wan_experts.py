"""Wan2.2-A14B's two experts against diffusers' own WanPipeline (nobody here wrote it): the tiny
two-expert folder (make_tiny_wan --variant a14b) loads in the stock pipeline with boundary_ratio 0.875;
our ODE rollout calls, at each step, the expert WanPipeline calls (``transformer`` for t >=
boundary_ratio * num_train_timesteps, else ``transformer_2``) with that expert's guidance scale
(guidance_scale / guidance_scale_2), and its latents and frames equal the pipeline's; a step whose
timestep is exactly the boundary goes to the high-noise expert (an off-by-one comparison fails here);
a replay's per-sample timesteps go to each row's expert, both experts called on every rank. The
current library line only."""

from __future__ import annotations

import pytest
import torch

from fastvideo.library_lines import CURRENT, library_line

pytestmark = pytest.mark.skipif(library_line() != CURRENT, reason="Wan2.2-A14B needs the current library line "
                                "(diffusers 0.42.1's WanPipeline; the recipe line's 0.32 has no Wan)")

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ, FRAMES, SIZE, HIGH_SCALE, LOW_SCALE = 16, 5, 32, 4.0, 3.0
# Timesteps 1000, 875, 500, 250: the second is exactly 0.875 * 1000, the published boundary.
SIGMAS = [1.0, 0.875, 0.5, 0.25]


@pytest.fixture(scope="module")
def pipe(tiny_wan_a14b_dir):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = WanPipeline.from_pretrained(tiny_wan_a14b_dir)
    pipe.set_progress_bar_config(disable=True)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)  # shift 1: the sigmas as given
    plain = scheduler.set_timesteps
    scheduler.set_timesteps = lambda n=None, device=None, **kw: plain(sigmas=SIGMAS, device=device)
    pipe.scheduler = scheduler
    return pipe


def _family(folder, scale_2=LOW_SCALE):
    from fastvideo.models.wan.family import WanFamily

    family = WanFamily(guidance_scale=HIGH_SCALE, num_frames=FRAMES, guidance_scale_2=scale_2)
    family.check_folder(folder)
    return family


def _record(model, calls, name):
    return model.register_forward_pre_hook(lambda m, a, kw: calls.append((name, kw["hidden_states"].shape[0])),
                                           with_kwargs=True)


def test_tiny_a14b_loads_in_the_stock_pipeline_and_as_two_experts(pipe, tiny_wan_a14b_dir):
    from fastvideo.models.registry import family_of_folder
    from fastvideo.models.wan.experts import WanExperts

    assert pipe.config.boundary_ratio == 0.875 and pipe.config.expand_timesteps is False
    assert type(pipe.transformer_2).__name__ == "WanTransformer3DModel"
    assert family_of_folder(tiny_wan_a14b_dir) == "wan"
    family = _family(tiny_wan_a14b_dir)
    model = family.load_transformer(tiny_wan_a14b_dir, "transformer", "cpu", torch.float32)
    assert isinstance(model, WanExperts) and model.boundary_timestep == 875.0
    for ours, stock in ((model.transformer, pipe.transformer), (model.transformer_2, pipe.transformer_2)):
        assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), stock.state_dict().values()))
    high, low = (dict(m.named_parameters())["proj_out.weight"] for m in model.experts())
    assert not torch.equal(high, low)  # two experts, not one twice
    assert len(model.blocks) == 2 * pipe.transformer.config.num_layers


def test_ode_rollout_calls_each_steps_expert_as_the_pipeline(pipe, tiny_wan_a14b_dir):
    """Timesteps 1000, 875, 500, 250 with boundary 875: the pipeline calls transformer twice (875 >= 875)
    then transformer_2 twice, each a batched cond + uncond pass; ours the same experts in the same order
    with the same guidance scales, latents and decoded frames equal (<= 1e-5 relative; measured 0.0 for
    the latents). With t > boundary instead of >=, step 2 goes to transformer_2 and both asserts fail."""
    from fastvideo.models.latents import from_tokens
    from fastvideo.sampling.plan import ODE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    family = _family(tiny_wan_a14b_dir)
    model = family.load_transformer(tiny_wan_a14b_dir, "transformer", "cpu", torch.float32)
    cond = family.encode_prompts(family.load_text_encoders(tiny_wan_a14b_dir), PROMPTS, SEQ)
    pipe.scheduler.set_timesteps(len(SIGMAS))
    assert pipe.scheduler.timesteps.tolist() == [1000.0, 875.0, 500.0, 250.0]
    ours, theirs = [], []
    hooks = [_record(model.transformer, ours, "high"), _record(model.transformer_2, ours, "low"),
             _record(pipe.transformer, theirs, "high"), _record(pipe.transformer_2, theirs, "low")]
    try:
        cfg = RolloutConfig(height=SIZE, width=SIZE, sampling_steps=4, eta=0.0, shift=1.0, num_generations=1,
                            rollout_batch_size=2, init_same_noise=False)
        plan = SamplingPlan(sigmas=pipe.scheduler.sigmas.float().clone(), kinds=(ODE,) * 4, trainable=(),
                            num_trained=0)
        traj = rollout(family, model, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(3), 1, "cpu", plan=plan)
        grid = traj.layout["grid"]
        noise = from_tokens(traj.latents[:, 0], *grid)
        kwargs = dict(prompt=list(PROMPTS), negative_prompt="", guidance_scale=HIGH_SCALE,
                      guidance_scale_2=LOW_SCALE, height=SIZE, width=SIZE, num_frames=FRAMES,
                      num_inference_steps=4, max_sequence_length=SEQ)
        ref = pipe(**kwargs, latents=noise.clone(), output_type="latent").frames
    finally:
        for h in hooks:
            h.remove()
    assert [name for name, _ in ours] == ["high", "high", "low", "low"]  # one batched cond + uncond call
    assert [name for name, _ in theirs] == ["high"] * 4 + ["low"] * 4  # the pipeline: cond, then uncond
    latents = from_tokens(traj.latents[:, -1], *grid)
    rel = float((latents - ref).abs().max() / ref.abs().max())
    print(f"two experts: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    frames = pipe(**kwargs, latents=noise.clone(), output_type="pt").frames
    torch.testing.assert_close(traj.images, frames, rtol=0, atol=1e-5)
    # the low-noise expert's own scale is used: another guidance_scale_2 gives other latents
    other = _family(tiny_wan_a14b_dir, scale_2=1.5)
    moved = rollout(other, model, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(3), 1, "cpu", plan=plan)
    assert not torch.allclose(moved.latents[:, -1], traj.latents[:, -1], atol=1e-4)
    torch.testing.assert_close(moved.latents[:, 2], traj.latents[:, 2], rtol=0, atol=0)  # high-noise steps alike


def test_replay_sends_each_row_to_its_expert_and_calls_both(tiny_wan_a14b_dir, monkeypatch):
    """Per-sample sigmas (an update's replay): each row's velocity is its expert's (equal to the row
    computed alone at a shared sigma); on several ranks both experts are called even when every row is
    one expert's (the other on a stand-in row weighed 0: FSDP ranks run the same units), on one rank
    only the needed one; the boundary row is high noise."""
    from fastvideo import devices

    family = _family(tiny_wan_a14b_dir)
    model = family.load_transformer(tiny_wan_a14b_dir, "transformer", "cpu", torch.float32)
    cond = family.encode_prompts(family.load_text_encoders(tiny_wan_a14b_dir), PROMPTS * 2, SEQ)
    layout = family.nominal_layout(SIZE, SIZE, dict(model.config))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, *layout.tokens, generator=g)
    below = float(torch.nextafter(torch.tensor(0.875), torch.tensor(0.0)))
    sigma = torch.tensor([0.875, below, 0.9, 0.3])
    calls = []
    hooks = [_record(model.transformer, calls, "high"), _record(model.transformer_2, calls, "low")]
    try:
        with torch.no_grad():
            mixed = family.velocity(model, x, sigma, cond, layout)
            alone = torch.cat([family.velocity(model, x[i:i + 1], sigma[i], _rows(cond, i), layout)
                               for i in range(4)])
            calls.clear()
            high_rows = family.velocity(model, x[[0, 2]], sigma[[0, 2]], _rows(cond, 0, 2), layout)
            one_rank = list(calls)
            calls.clear()
            monkeypatch.setattr(devices, "world_size", lambda: 2)
            ranks = family.velocity(model, x[[0, 2]], sigma[[0, 2]], _rows(cond, 0, 2), layout)
    finally:
        for h in hooks:
            h.remove()
    torch.testing.assert_close(mixed, alone, rtol=0, atol=1e-5)  # batched vs alone: 2.4e-6 measured
    assert one_rank == [("high", 4)]  # rows 0 and 2 (0.875 included) high: cond + uncond rows
    assert calls == [("high", 4), ("low", 2)]  # several ranks: low on a stand-in row (cond + uncond)
    torch.testing.assert_close(ranks, high_rows, rtol=0, atol=0)
    torch.testing.assert_close(high_rows, mixed[[0, 2]], rtol=0, atol=1e-5)


def _rows(cond, *rows):
    return cond.select(torch.tensor(rows))


def test_the_cost_models_a14b_is_two_14b_experts_and_trains_the_chosen():
    """--model wan2.2-t2v-a14b (models/wan/reference.py): two meta experts of the 14B's config (14.29 B
    parameters each); --train_experts high leaves the low-noise expert's parameters frozen; one-expert
    models refuse the flag in one line."""
    from fastvideo.errors import ConfigError
    from fastvideo.models.wan.experts import WanExperts
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.tools.cost_model import resolve_model, set_train_experts

    family = WanFamily(num_frames=5)
    config, _, _ = resolve_model("wan2.2-t2v-a14b", family)
    model = family.meta_transformer(config, torch.bfloat16)
    assert isinstance(model, WanExperts) and model.boundary_ratio == 0.875
    sizes = [sum(p.numel() for p in e.parameters()) for e in model.experts()]
    assert sizes[0] == sizes[1] and round(sizes[0] / 1e9, 2) == 14.29 and len(family.blocks(model)) == 80
    set_train_experts(family, config, "high")
    assert family.trained_parts(model) == (model.transformer,)
    with pytest.raises(ConfigError, match="--train_experts high: this model has one transformer"):
        set_train_experts(family, resolve_model("wan2.1-t2v-14b", family)[0], "high")


def test_the_memory_model_adapts_only_the_trained_experts(tiny_wan_a14b_dir):
    """cost_model --memory --use_lora on a two-expert model folder: the folder counts as two experts
    (model_index.json's boundary_ratio, as the wan2.2-t2v-a14b entry); LoRA adapts the trained experts
    only (as the trainer does), so --train_experts low counts half the adapters of high,low, and the
    update's activation pass runs through a trained expert (the frozen one has no gradient to take)."""
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.perf.memory import MemoryShape, profile_model
    from fastvideo.tools.cost_model import resolve_model, set_train_experts

    shape = MemoryShape(height=32, width=32, text_tokens=8, sampling_steps=2, samples_per_rank=2, rollout_batch=1,
                        micro_batch=1, world_size=2, lora_rank=4)
    got = {}
    for experts in ("high,low", "low"):
        family = WanFamily(num_frames=5)
        config, vae_config, _ = resolve_model(str(tiny_wan_a14b_dir), family)
        assert config["two_experts"] == 0.875  # the folder's model_index.json: both experts are counted
        set_train_experts(family, config, experts)
        got[experts] = profile_model(config, vae_config, shape, family)
    both, low = got["high,low"], got["low"]
    assert both.adapter_params == 2 * low.adapter_params > 0 and both.root_adapter_params == low.root_adapter_params == 0
    assert both.largest_block_adapter_params == low.largest_block_adapter_params > 0
    assert low.update_activations == both.update_activations > 0  # the same shape of pass, through the trained expert
