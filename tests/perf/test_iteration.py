"""Iteration accounting and utilisation arithmetic, checked by hand."""

import pytest

from fastvideo.config import GRPOSettings
from fastvideo.grpo.loss import num_trained_steps
from fastvideo.perf import flops as F
from fastvideo.models.flux import flops as FX

# A toy transformer small enough to count by hand: D = 2 x 2 = 4, MLP 16, in/out 8, text 6, pooled 5.
TOY = FX.FluxDims(num_layers=1, num_single_layers=2, num_attention_heads=2, attention_head_dim=2,
                 joint_attention_dim=6, pooled_projection_dim=5, in_channels=8)


def test_toy_forward_by_hand():
    L, Lt, B = 3, 2, 1  # S = 5 tokens
    embed = (2 * 3 * 8 * 4  # x_embedder
             + 2 * 2 * 6 * 4  # context_embedder
             + 2 * (2 * 256 * 4 + 2 * 4 * 4)  # timestep + guidance TimestepEmbedding
             + (2 * 5 * 4 + 2 * 4 * 4))  # text_embedder (pooled)
    double = (2 * (2 * 4 * 24)  # two AdaLayerNormZero linears D -> 6D
              + 4 * (2 * 5 * 4 * 4)  # q, k, v, out over image and text tokens
              + 2 * (2 * 5 * 4 * 16)  # MLP up and down
              + 4 * 5 * 5 * 4)  # joint attention QK^T + AV
    single = (2 * 4 * 12  # AdaLayerNormZeroSingle D -> 3D
              + 2 * 5 * 4 * 16  # proj_mlp
              + 3 * (2 * 5 * 4 * 4)  # q, k, v
              + 4 * 5 * 5 * 4  # attention
              + 2 * 5 * 20 * 4)  # proj_out over [attn, mlp] = 5D -> D
    final = 2 * 4 * 8 + 2 * 3 * 4 * 8  # norm_out D -> 2D, proj_out on image tokens
    assert FX.transformer_forward_flops(TOY, L, Lt, B) == embed + double + 2 * single + final
    assert FX.transformer_block_flops(TOY, L, Lt, B) == double + 2 * single
    assert FX.transformer_forward_flops(TOY, L, Lt, 3) == 3 * FX.transformer_forward_flops(TOY, L, Lt, 1)
    # backward: 2 x forward minus the input gradients of the layers fed by data only
    data_fed = 2 * 3 * 8 * 4 + 2 * 2 * 6 * 4 + 2 * (2 * 256 * 4) + 2 * 5 * 4
    assert FX.transformer_backward_flops(TOY, L, Lt, B) == 2 * (embed + double + 2 * single + final) - data_fed


def test_iteration_phases_by_hand():
    shape = F.IterationShape(height=48, width=32, text_tokens=2, sampling_steps=5, num_generations=3,
                             prompts_per_rank=2, world_size=4, trained_steps=2, gradient_checkpointing=True)
    vae = {"block_out_channels": [4, 8], "layers_per_block": 1, "latent_channels": 16, "out_channels": 3,
           "use_post_quant_conv": False}
    it = F.iteration_flops(shape, TOY, vae)
    L = 3 * 2  # (48/16) x (32/16)
    fwd = FX.transformer_forward_flops(TOY, L, 2)
    samples = 4 * 2 * 3
    assert shape.samples == samples and shape.image_tokens == L
    assert it.rollout == 5 * samples * fwd
    assert it.update_forward == 2 * samples * fwd
    assert it.update_backward == 2 * samples * FX.transformer_backward_flops(TOY, L, 2)
    assert it.recompute == 2 * samples * FX.transformer_block_flops(TOY, L, 2)
    assert it.vae_decode == samples * F.vae_decoder_flops(vae, 6, 4)
    assert it.model_flops == it.rollout + it.update_forward + it.update_backward + it.vae_decode
    assert it.hardware_flops == it.model_flops + it.recompute
    d = it.as_dict()
    assert d["hardware_total"] == it.hardware_flops and d["rollout"] == it.rollout
    no_ckpt = F.iteration_flops(F.IterationShape(**{**shape.__dict__, "gradient_checkpointing": False}), TOY, vae)
    assert no_ckpt.recompute == 0 and no_ckpt.hardware_flops == it.model_flops


def test_vae_decoder_by_hand():
    # conv_in 16->8, mid: 2 resnets 8->8 + attention over 2x2 pixels, up block 0 (8): 2 resnets then
    # upsample conv at 4x4, up block 1 (4): resnet 8->4 (with 1x1 shortcut) + resnet 4->4, conv_out 4->3.
    vae = {"block_out_channels": [4, 8], "layers_per_block": 1, "latent_channels": 16, "out_channels": 3,
           "use_post_quant_conv": False, "mid_block_add_attention": True}
    def conv(ci, co, k, hw):
        return 2 * ci * co * k * k * hw

    def res(ci, co, hw):
        return conv(ci, co, 3, hw) + conv(co, co, 3, hw) + (conv(ci, co, 1, hw) if ci != co else 0)

    expect = (conv(16, 8, 3, 4) + 2 * res(8, 8, 4) + (4 * 2 * 4 * 8 * 8 + 4 * 4 * 4 * 8)
              + 2 * res(8, 8, 4) + conv(8, 8, 3, 16) + res(8, 4, 16) + res(4, 4, 16) + conv(4, 3, 3, 16))
    assert F.vae_decoder_flops(vae, 2, 2) == expect


def test_cost_model_trained_steps_follow_the_trainer_rule():
    from fastvideo.tools import cost_model

    for n, frac, last in [(16, 0.6, False), (16, 0.6, True), (25, 0.6, False), (10, 1.0, True), (2, 0.1, False)]:
        g = GRPOSettings(use_group=True, adv_std="sample", train_last_step=last, timestep_fraction=frac,
                         clip_range=1e-4, adv_clip_max=5.0, loss_coef=1.0)
        argv = ["--sampling_steps", str(n), "--timestep_fraction", str(frac)] + (["--train_last_step"] if last else [])
        assert cost_model.parse_args(argv).trained_steps == g.trained_steps(n)
    assert num_trained_steps(16, 0.6) == 9 and num_trained_steps(16, 0.6, train_last_step=True) == 9  # int(15 * 0.6)
    assert num_trained_steps(10, 1.0) == 9 and num_trained_steps(10, 1.0, True) == 10


def test_reference_iteration_is_about_3_7e17():
    it = F.iteration_flops(F.IterationShape())  # 720x720, 16 steps, 12 x 16 samples, 9 trained, checkpointing
    fwd = FX.transformer_forward_flops(FX.FLUX_DEV, 2025, 512)
    assert fwd == 37_282_012_311_552
    assert it.rollout == 16 * 192 * fwd
    assert 3.72e17 < it.hardware_flops < 3.74e17
    assert 3.08e17 < it.model_flops < 3.10e17
    assert 1.999 < FX.transformer_backward_flops(FX.FLUX_DEV, 2025, 512) / fwd < 2.0
    assert it.vae_decode / it.hardware_flops < 0.003


def test_utilisation_and_peaks():
    assert F.utilisation(1e15, 1.0, 2, 500.0) == pytest.approx(1.0)
    assert F.utilisation(3.0e17, 300.0, 16, 1000.0) == pytest.approx(0.0625)
    for bad in [(1e15, 0.0, 1, 1.0), (1e15, 1.0, 0, 1.0), (1e15, 1.0, 1, 0.0)]:
        with pytest.raises(ValueError):
            F.utilisation(*bad)
    assert F.peak_tflops_for("NVIDIA H200") == pytest.approx(989.4)
    assert F.peak_tflops_for("NVIDIA H20") == 148.0
    assert F.peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert F.peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert F.peak_tflops_for("Ascend910C") == 376.0
    assert F.peak_tflops_for("some CPU") is None


def test_bad_shapes_fail_early():
    with pytest.raises(ValueError, match="trained_steps"):
        F.IterationShape(sampling_steps=4, trained_steps=5)
    with pytest.raises(ValueError, match="multiple of 16"):
        F.IterationShape(height=700)
    with pytest.raises(ValueError, match="world_size"):
        F.IterationShape(world_size=0)


def test_nft_counts_its_no_grad_update_forwards():
    """NFT: one no-grad forward per trained (sample, step) for the old policy, one more for a KL
    reference; MFU counts them. The cost model's --algorithm nft trains int(N x fraction) of all N."""
    from fastvideo.tools.cost_model import parse_args, summarise

    shape = F.IterationShape(height=32, width=32, text_tokens=2, sampling_steps=10, num_generations=2,
                             world_size=1, trained_steps=9, nograd_update_forwards=2)
    it = F.iteration_flops(shape, TOY)
    fwd = FX.transformer_forward_flops(TOY, shape.image_tokens, 2)
    assert it.update_nograd == 2 * 9 * 2 * fwd == 2 * it.update_forward
    assert it.model_flops == it.rollout + it.update_forward + it.update_backward + it.vae_decode + it.update_nograd
    args = parse_args(["--algorithm", "nft", "--sampling_steps", "10", "--timestep_fraction", "0.99",
                       "--kl_coef", "1e-4", "--h", "256", "--w", "256"])
    s = summarise(args, TOY, None)
    assert s["trained_steps"] == 9 and s["nograd_update_forwards"] == 2
    assert s["flops"]["update_nograd"] == 2 * s["flops"]["update_forward"]
    grpo = parse_args(["--sampling_steps", "10", "--timestep_fraction", "0.99", "--h", "256", "--w", "256"])
    assert grpo.trained_steps == 8 and grpo.nograd_update_forwards == 0  # GRPO: the last transition never trains


def test_the_new_objectives_count_their_own_update_work():
    """As the objectives declare it (issue #49): AWM and DGPO train int(N x fraction) of all N
    timesteps with no stored transition (AWM no extra forward without --kl_coef; DGPO its old policy's
    and its reference's v, always), Flash-GRPO its one SDE step; the memory shape keeps x0 alone for
    AWM and DGPO and counts DGPO's reference without --kl_coef."""
    from fastvideo.tools.cost_model import memory_shape, parse_args, summarise

    base = ["--sampling_steps", "10", "--timestep_fraction", "0.4", "--h", "256", "--w", "256"]
    grpo = summarise(parse_args(base), TOY, None)
    counts = {}
    for algorithm in ("awm", "dgpo", "flash_grpo"):
        args = parse_args(base + ["--algorithm", algorithm])
        s = summarise(args, TOY, None)
        counts[algorithm] = (s["trained_steps"], s["nograd_update_forwards"], memory_shape(args).keeps_latents,
                             memory_shape(args).kl_reference)
        assert s["flops"]["update_nograd"] == s["nograd_update_forwards"] * s["flops"]["update_forward"]
    assert counts == {"awm": (4, 0, False, False), "dgpo": (4, 2, False, True), "flash_grpo": (1, 0, True, False)}
    assert grpo["trained_steps"] == 3  # int(9 x 0.4): GRPO never trains the last transition
    awm_kl = parse_args(base + ["--algorithm", "awm", "--kl_coef", "0.1"])
    assert awm_kl.nograd_update_forwards == 1 and memory_shape(awm_kl).kl_reference
    assert parse_args(base + ["--algorithm", "flash_grpo", "--trained_steps", "2"]).trained_steps == 2  # as given
    # an objective's own training flags are training flags (a launcher's command line), ignored
    assert parse_args(base + ["--algorithm", "flash_grpo", "--flash_candidate_fraction", "0.5"]).trained_steps == 1
