"""The KL penalty to the reference policy: closed form, gradient, and its effect on training."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fastvideo.grpo.kl import gaussian_step_kl
from fastvideo.sampling import sde

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from helpers import single_process_trainer, train_args  # noqa: E402


@pytest.mark.parametrize("per_sample_sigma", [False, True])
def test_closed_form_equals_torch_distributions(per_sample_sigma):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g)
    v, v_ref = torch.randn(3, 5, 4, generator=g), torch.randn(3, 5, 4, generator=g)
    sig = torch.tensor([0.9, 0.5, 0.3]) if per_sample_sigma else 0.7
    sig_next = torch.tensor([0.7, 0.2, 0.1]) if per_sample_sigma else 0.4
    mean, std = sde.step_gaussian(x, v, sig, sig_next, eta=0.6)
    ref_mean, ref_std = sde.step_gaussian(x, v_ref, sig, sig_next, eta=0.6)
    assert torch.equal(std, ref_std)
    p = torch.distributions.Normal(mean.double(), std.double().expand_as(mean))
    q = torch.distributions.Normal(ref_mean.double(), ref_std.double().expand_as(mean))
    expected = torch.distributions.kl_divergence(p, q).mean(dim=(1, 2))
    torch.testing.assert_close(gaussian_step_kl(mean, ref_mean, std).double(), expected, rtol=1e-5, atol=0)
    assert torch.equal(gaussian_step_kl(mean, mean, std), torch.zeros(3))


def test_step_gaussian_is_the_distribution_sde_step_scores():
    g = torch.Generator().manual_seed(1)
    x, v, nxt = (torch.randn(2, 6, 3, generator=g) for _ in range(3))
    mean, std = sde.step_gaussian(x, v, 0.8, 0.5, eta=0.4)
    _, logp = sde.sde_step(x, v, 0.8, 0.5, eta=0.4, prev_sample=nxt)
    expected = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(nxt).mean(dim=(1, 2))
    torch.testing.assert_close(logp, expected)


def _lora_tiny(tiny_flux_dir):
    """The tiny transformer in float64 with random (non-zero) adapters."""
    from fastvideo.models import flux
    from fastvideo.training.lora import LoraSettings, apply_lora

    model = flux.load_transformer(tiny_flux_dir, device=torch.device("cpu"), dtype=torch.float64)
    apply_lora(model, LoraSettings(True, 2, 4.0, 0.0, ("to_q", "to_v"), None), torch.float64, torch.float64, seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n)), dtype=p.dtype) * 0.3)
    return model


def test_kl_gradient_matches_finite_differences(tiny_flux_dir):
    from fastvideo.training.lora import adapters_disabled

    model = _lora_tiny(tiny_flux_dir)
    cfg = model.config
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, cfg.in_channels, generator=g, dtype=torch.float64)
    kw = dict(encoder_hidden_states=torch.randn(2, 8, cfg.joint_attention_dim, generator=g, dtype=torch.float64),
              pooled_projections=torch.randn(2, cfg.pooled_projection_dim, generator=g, dtype=torch.float64),
              timestep=torch.tensor([0.8, 0.8], dtype=torch.float64), img_ids=torch.zeros(4, 3),
              txt_ids=torch.zeros(8, 3), guidance=torch.tensor([3.5, 3.5], dtype=torch.float64), return_dict=False)
    with torch.no_grad(), adapters_disabled(model):
        ref_mean, _ = sde.step_gaussian(x, model(hidden_states=x, **kw)[0], 0.8, 0.6, eta=0.5)

    def kl_of_model() -> torch.Tensor:
        mean, std = sde.step_gaussian(x, model(hidden_states=x, **kw)[0], 0.8, 0.6, eta=0.5)
        # step_gaussian computes in float32; redo the maths in float64 from the same velocity for the check
        return gaussian_step_kl(mean, ref_mean, std).sum()

    # float64 throughout for a sharp finite difference: the model's velocity in float64
    def kl64() -> torch.Tensor:
        v = model(hidden_states=x, **kw)[0]
        s, s_next, eta = 0.8, 0.6, 0.5
        x0 = x - s * v
        score = -(x - (1 - s) * x0) / (s * s)
        mean = x + (s_next - s) * (v - 0.5 * eta * eta * score)
        std = torch.tensor(eta * (s - s_next) ** 0.5, dtype=torch.float64)
        return (((mean - ref_mean.double()) ** 2) / (2 * std ** 2)).mean(dim=(1, 2)).sum()

    param = dict(model.named_parameters())["transformer_blocks.0.attn.to_q.lora_A.default.weight"]
    model.zero_grad()
    kl_of_model().backward()
    autograd_f32 = param.grad.clone()
    model.zero_grad()
    kl64().backward()
    autograd = param.grad.clone()
    torch.testing.assert_close(autograd_f32, autograd, rtol=1e-3, atol=1e-6)  # the float32 path: same gradient
    # h = 1e-3: some of diffusers' FLUX (timestep embedding) runs in float32 even for a float64 model,
    # so a tiny h would difference rounding noise; the central difference's O(h^2) error is far smaller.
    h = 1e-3
    for idx in [(0, 0), (1, 3), (0, 5)]:
        with torch.no_grad():
            param[idx] += h
            up = kl64().item()
            param[idx] -= 2 * h
            down = kl64().item()
            param[idx] += h
        fd = (up - down) / (2 * h)
        assert abs(fd - autograd[idx].item()) <= 1e-8 + 1e-3 * abs(fd), (idx, fd, autograd[idx].item())
    assert autograd.abs().max() > 1e-4  # a zero gradient would pass trivially


@pytest.mark.parametrize("lora", [True, False])
def test_kl_is_zero_before_the_first_update_and_logged(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch, lora):
    extra = dict(use_lora=True, lora_rank=4, lora_alpha=8) if lora else {}
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, kl_coef=0.5, max_train_steps=2,
                      save_images_every=0, learning_rate=1e-2, **extra)
    trainer = single_process_trainer(argv, monkeypatch)
    first = trainer.run_iteration()
    assert first["kl"] == 0.0  # one optimizer step per iteration: every term precedes it
    second = trainer.run_iteration()
    assert second["kl"] > 0.0


def _velocity_gap(trainer) -> float:
    """Mean squared difference between the policy's and the base's velocity on fixed random
    inputs: the distance the KL term penalises (it is proportional to it at a fixed step)."""
    from fastvideo.training.lora import adapters_disabled

    model, cfg = trainer.model.eval(), trainer.model.config
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, cfg.in_channels, generator=g)
    kw = dict(encoder_hidden_states=torch.randn(2, 8, cfg.joint_attention_dim, generator=g),
              pooled_projections=torch.randn(2, cfg.pooled_projection_dim, generator=g),
              timestep=torch.tensor([0.7, 0.4]), img_ids=torch.zeros(4, 3), txt_ids=torch.zeros(8, 3),
              guidance=torch.tensor([3.5, 3.5]), return_dict=False)
    with torch.no_grad():
        v = model(hidden_states=x, **kw)[0]
        with adapters_disabled(model):
            v_base = model(hidden_states=x, **kw)[0]
    return float(((v - v_base) ** 2).mean())


def test_large_beta_keeps_the_policy_closer_to_the_base(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """Same run (seed, data, lr) with beta 0 and beta 1e4 for 4 iterations. Measured on CPU: the
    velocity gap to the base is about 4x smaller with the penalty (Adam still moves the adapters
    every step, so it does not vanish)."""
    gaps = {}
    for beta in (0.0, 1e4):
        argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / str(beta), use_lora=True, lora_rank=4,
                          lora_alpha=8, kl_coef=beta, max_train_steps=4, save_images_every=0, learning_rate=1e-2,
                          checkpointing_steps=100)
        trainer = single_process_trainer(argv, monkeypatch)
        for _ in range(4):
            trainer.run_iteration()
        gaps[beta] = _velocity_gap(trainer)
    print(f"velocity gap to the base after 4 iterations: {gaps}")
    assert gaps[0.0] > 0 and gaps[1e4] < 0.5 * gaps[0.0], gaps


@pytest.mark.slow
def test_full_fine_tuning_kl_with_a_sharded_reference_two_ranks(tiny_flux_dir, tiny_embeddings, tmp_path):
    """Full fine-tuning under FSDP (2 gloo ranks) with the frozen reference copy sharded like the
    model: KL exactly 0 in iteration 1 (one optimizer step, after every term), positive after."""
    from helpers import read_metrics, torchrun

    proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, tmp_path, kl_coef=0.5, max_train_steps=2,
                               save_images_every=0, gradient_checkpointing=True))
    assert proc.returncode == 0, proc.stderr[-4000:]
    kl = [r["kl"] for r in read_metrics(tmp_path)]
    assert kl[0] == 0.0 and kl[1] > 0.0


def _flow_grpo_kl(transformer, x, sigma, sigma_next, eta, sigma_max, cond, lat_hw, scale, ref_off):
    """Flow-GRPO's KL term written out from scripts/train_sd3.py / sd3_sde_with_logprob.py (ac4c86e),
    one sample at a time, the two guidance passes as two separate transformer calls:
    std_dev_t = sqrt(sigma / (1 - sigma or sigma_max)) * eta; prev_sample_mean = x (1 + std_dev_t^2 /
    (2 sigma) dt) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt; kl = mean((mean - mean_ref)^2) /
    (2 std_dev_t^2). scale None: the conditional velocity alone (what a wrong KL would use)."""
    h, w = lat_hw
    out = []
    for i in range(x.shape[0]):
        s, s_next = float(sigma[i]), float(sigma_next[i])
        grid = x[i:i + 1].reshape(1, h, w, -1).permute(0, 3, 1, 2)
        t = torch.tensor([1000.0 * s])

        def v_of(embeds, pooled):
            o = transformer(hidden_states=grid, encoder_hidden_states=embeds, pooled_projections=pooled, timestep=t,
                            return_dict=False)[0]
            return o.permute(0, 2, 3, 1).reshape(1, h * w, -1)

        def guided():
            v_c = v_of(cond["prompt_embeds"][i:i + 1], cond["pooled"][i:i + 1])
            if scale is None:
                return v_c
            v_u = v_of(cond["neg_prompt_embeds"][None], cond["neg_pooled"][None])
            return v_u + scale * (v_c - v_u)

        def mean_of(v):
            std_dev_t = (s / (1 - (sigma_max if s == 1.0 else s))) ** 0.5 * eta
            dt = s_next - s
            return (x[i:i + 1] * (1 + std_dev_t ** 2 / (2 * s) * dt)
                    + v * (1 + std_dev_t ** 2 * (1 - s) / (2 * s)) * dt), std_dev_t

        with torch.no_grad():
            mean, std_dev_t = mean_of(guided())
            with ref_off():
                mean_ref, _ = mean_of(guided())
        out.append(((mean - mean_ref) ** 2).mean() / (2 * std_dev_t ** 2))
    return torch.stack(out)


def test_flow_grpo_kl_on_sd3_uses_the_guided_velocity_and_flow_grpos_scale(tiny_sd3_dir):
    """--kl_coef with --flow_grpo_sampling on the SD3 family under guidance 4.5: the objective's KL
    of two steps (one at sigma 1, where Flow-GRPO's std uses sigma_max) equals Flow-GRPO's formula
    computed here from separate unconditional / conditional calls, and enters the loss as +beta KL
    with the policy term's normalisation. The unguided KL and the exact Gaussian KL (no factor
    sigma - sigma_next) are far from it, so either mistake fails."""
    from types import SimpleNamespace

    from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator, Term
    from fastvideo.algorithms.grpo import GRPOObjective
    from fastvideo.component_settings.lora import LoraSettings
    from fastvideo.component_settings.update import UpdateSettings
    from fastvideo.config import GRPOSettings
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.models.base import TensorConditioning
    from fastvideo.models.sd3 import components as C
    from fastvideo.models.sd3.family import SD3Family
    from fastvideo.sampling.plan import full_sde_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import Trajectory
    from fastvideo.training.kl_reference import AdapterOffReference
    from fastvideo.training.lora import adapters_disabled, apply_lora
    from fastvideo.training.policy import Policy

    model = C.load_transformer(tiny_sd3_dir, "transformer", torch.device("cpu"), torch.float32)
    apply_lora(model, LoraSettings(True, 2, 4.0, 0.0, ("to_q", "to_v", "add_k_proj"), None), torch.float32,
               torch.float32, seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    cfg, g = model.config, torch.Generator().manual_seed(4)
    family, scale, eta, beta = SD3Family(guidance_scale=4.5), 4.5, 0.7, 0.01
    layout = family.nominal_layout(32, 32, dict(cfg))
    b, lt = 2, C.CLIP_TOKENS + 4
    cond = TensorConditioning({"prompt_embeds": torch.randn(b, lt, cfg.joint_attention_dim, generator=g),
                               "pooled": torch.randn(b, cfg.pooled_projection_dim, generator=g)},
                              {"neg_prompt_embeds": torch.randn(lt, cfg.joint_attention_dim, generator=g),
                               "neg_pooled": torch.randn(cfg.pooled_projection_dim, generator=g)})
    plan = full_sde_plan(4, 3.0, candidates=3, num_trained=1, sde_kind="flow")
    traj = Trajectory(latents=torch.randn(b, 5, *layout.tokens, generator=g), log_probs=torch.zeros(b, 4),
                      sigmas=plan.sigmas, x0=torch.zeros(b, *layout.tokens), images=None, cond=cond, layout=layout,
                      sample_ids=torch.arange(b), group_ids=torch.zeros(b, dtype=torch.long), plan=plan)
    settings = GRPOSettings(use_group=True, adv_std="sample", train_last_step=False, timestep_fraction=0.5,
                            clip_range=1e-4, adv_clip_max=5.0, loss_coef=1.0, kl_coef=beta)
    update = UpdateSettings(train_micro_batch_size=2, gradient_accumulation_steps=1)
    cfg = SimpleNamespace(grpo=settings, update=update, mix=None,
                          rollout=SimpleNamespace(num_generations=2, eta=eta, shift=3.0))
    obj = GRPOObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0), device=torch.device("cpu"),
                                         randomness=RandomSource(3), reward=None))
    policy = Policy(model, family, torch.device("cpu"), None, AdapterOffReference(model))
    rows, steps = torch.arange(b), torch.tensor([0, 2])  # sigma 1 -> 0.9 and 0.75 -> 0.5
    x, sig, sig_next = traj.latents[rows, steps], plan.sigmas[steps], plan.sigmas[steps + 1]
    assert float(sig[0]) == 1.0

    _, kl = obj.log_prob(policy, traj, rows, steps)
    args = (x, sig, sig_next, eta, plan.host_sigmas[1], cond, layout.latent_hw)
    expected = _flow_grpo_kl(model, *args, scale, lambda: adapters_disabled(model))
    print(f"Flow-GRPO KL per sample: {expected.tolist()}")
    assert expected.min() > 1e-6  # the adapters move the step mean (3.4e-6 and 3.5e-4 on the tiny SD3.5)
    print(f"relative gap to the formula: {((kl - expected).abs() / expected).max():.2e}")
    torch.testing.assert_close(kl, expected, rtol=1e-4, atol=0)
    unguided = _flow_grpo_kl(model, *args, None, lambda: adapters_disabled(model))
    assert ((unguided - expected).abs() > 0.2 * expected).all(), (unguided, expected)
    exact_gaussian = expected / (sig - sig_next)  # the KL of the two step Gaussians: >= 4x larger here
    assert ((exact_gaussian - expected).abs() > expected).all()

    # The loss: zero advantages leave only the KL term, + beta * mean KL / (GA * T).
    stats = StatsAccumulator(torch.device("cpu"))
    loss = obj.loss(policy, traj, torch.zeros(b), Term(0, rows, steps), stats)
    torch.testing.assert_close(loss.detach(), beta * expected.mean() / (1 * plan.num_trained), rtol=1e-4, atol=0)
