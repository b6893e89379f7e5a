"""Every sampling plan of the trainer on Wan's video latents [B, C, F, H, W] (issue #47 item 1; the
full SDE: tests/training/test_wan_training.py): MixGRPO's sliding window, MixGRPO-Flash (DPM-Solver++ after the window), Flow-GRPO-Fast and
DPM everywhere. For each, the transformer's forward and backward calls equal the analytic count
(fastvideo.perf.flops.pass_counts; CFG doubles every forward), the update replays exactly the
rollout's transition (first_ratio_dev: log-prob of the same step under the same weights), and the
plan is the one the flags describe."""

from __future__ import annotations

import pytest
import torch

from current_line_helpers import line_reason
from helpers import single_process_trainer, train_args

pytestmark = pytest.mark.skipif(line_reason("Wan training") is not None, reason=line_reason("Wan training") or "")

WINDOW = dict(training_strategy="part", group_size=2, iters_per_group=1, sample_strategy="progressive",
              prog_overlap=True, prog_overlap_step=1, roll_back=True)
PLANS = {  # flags, (plan after iteration 2, steps trained)
    "mixgrpo": (WINDOW, ("OSSOOO", 2)),
    "flash": (dict(WINDOW, dpm_algorithm_type="dpmsolver++", dpm_post_compress_ratio=0.5, dpm_solver_type="midpoint"),
              ("OSSD", 2)),  # after the window int((6 - 2) * 0.5) = 2 points: one DPM step
    "fast": (dict(sde_steps=1, sde_start="random"), (None, 1)),
    # SDE-DPM-Solver++ in the window: Flow-GRPO's SDE step (--flow_grpo_sampling) is not asked for
    "dpm_all": (dict(WINDOW, dpm_algorithm_type="dpmsolver++", dpm_apply_strategy="all", dpm_solver_order=3,
                     flow_grpo_sampling=None), ("DSSDDD", 2)),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_every_plan_counts_passes_and_replays_the_rollout_on_clips(name, tiny_wan_dir, wan_embeddings, tmp_path,
                                                                    monkeypatch):
    from fastvideo.perf.flops import pass_counts

    flags, (described, trained) = PLANS[name]
    argv = train_args(wan_embeddings, tiny_wan_dir, tmp_path, **{
        "model_family": "wan", "num_frames": 5, "sampling_steps": 6, "timestep_fraction": 1.0, "guidance_scale": 5.0,
        "no_quantize_timestep": True, "flow_grpo_sampling": True, "save_images_every": 0, "init_same_noise": True,
        "max_train_steps": 2, **flags})
    trainer = single_process_trainer(argv, monkeypatch)
    calls = {"fwd": 0, "bwd": 0, "frames": set()}

    def count(module, args, kwargs):
        calls["fwd"] += int(kwargs["hidden_states"].shape[0])
        calls["frames"].add(int(kwargs["hidden_states"].shape[2]))  # latent frames of a 5-frame clip: 2

    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    real_backward = torch.Tensor.backward

    def backward(t, *a, **k):
        calls["bwd"] += 1
        return real_backward(t, *a, **k)

    monkeypatch.setattr(torch.Tensor, "backward", backward)
    for it in (1, 2):
        calls.update(fwd=0, bwd=0)
        plan = trainer.sampling_plan(it)
        rec = trainer.run_iteration()
        n = pass_counts(plan.num_steps, plan.num_trained, 2, 2, 2, shared_prefix=plan.shared_prefix(), prompts=1)
        # true CFG: each sample's forward is a conditional and an unconditional pass in one batch
        assert calls["fwd"] == 2 * (n.rollout_forward_samples + n.update_forward_samples), (name, it)
        assert calls["bwd"] == n.update_calls
        assert rec["first_ratio_dev"] < 1e-4, (name, it, rec["first_ratio_dev"])
        assert rec["grad_norm"] > 0
    assert calls["frames"] == {2}
    assert plan.num_trained == trained and (described is None or plan.describe() == described), plan.describe()
