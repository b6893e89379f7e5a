"""A scheduler's shift_terminal (diffusers' FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal):
the rollout's grid is stretched to the model family's ModelFamily.schedule_terminal, generically, on
both --sigma_grid choices; a family without one keeps its plan bit for bit. (Qwen-Image against its
stock pipeline: tests/models/test_qwen_image.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from fastvideo.eval.core import SampleSettings, eval_plan
from fastvideo.sampling import sde
from fastvideo.sampling.plan import compressed_tail_sigmas, full_sde_plan, on_grid, ode_plan
from fastvideo.training.trainer import Trainer


@pytest.mark.parametrize("terminal", [0.02, 0.1])
@pytest.mark.parametrize("shift, steps", [(3.0, 10), (1.7, 28), (1.0, 4)])
def test_both_grids_equal_the_scheduler_with_shift_terminal(shift, steps, terminal):
    """diffusers' grid: set_timesteps(N) of a static-shift scheduler with shift_terminal; the
    shifted_linspace grid: the same scheduler given the linspace(1, 1/N) sigmas (as QwenImagePipeline
    and FluxPipeline pass them)."""
    sched = FlowMatchEulerDiscreteScheduler(shift=shift, shift_terminal=terminal)
    sched.set_timesteps(steps)
    ours = sde.grid_sigmas("diffusers", steps, shift, terminal)
    torch.testing.assert_close(ours, sched.sigmas, rtol=0, atol=1e-6)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps))
    plan = on_grid(full_sde_plan(steps, shift, steps, 1), "shifted_linspace", steps, shift, terminal)
    torch.testing.assert_close(plan.sigmas, sched.sigmas, rtol=0, atol=1e-6)
    assert float(plan.sigmas[0]) == 1.0 and float(plan.sigmas[-2]) == pytest.approx(terminal, abs=1e-7)
    assert float(plan.sigmas[-1]) == 0.0


def test_no_terminal_keeps_the_plan_and_a_tail_maps_consistently():
    plan = full_sde_plan(10, 3.0, 10, 2)
    assert on_grid(plan, "shifted_linspace", 10, 3.0, None) is plan
    full = on_grid(plan, "shifted_linspace", 10, 3.0, 0.05).sigmas
    tail = compressed_tail_sigmas(10, 3.0, 6, 0.5)  # a compressed DPM tail: its own noise levels
    stretched = sde.stretch_to_terminal(tail, 0.05, last=sde.sigma_schedule(10, 3.0)[-2])
    torch.testing.assert_close(stretched[0], full[6], rtol=0, atol=0)  # same map as the full grid's
    assert bool((stretched[:-1] > 0).all()) and bool((stretched[:-1].diff() < 0).all())


def test_the_trainer_and_the_evaluation_read_the_familys_terminal():
    """Trainer.sampling_plan and eval_plan stretch to the family's value, whatever the family."""
    r = SimpleNamespace(sampling_steps=8, shift=2.0, sigma_grid="shifted_linspace")
    objective = SimpleNamespace(sampling_plan=lambda it, n, s: full_sde_plan(n, s, n, 1))
    for terminal in (None, 0.02):
        family = SimpleNamespace(schedule_terminal=lambda t=terminal: t)
        plan = Trainer.sampling_plan(SimpleNamespace(cfg=SimpleNamespace(rollout=r), objective=objective,
                                                     family=family), 0)
        expected = sde.grid_sigmas("shifted_linspace", 8, 2.0, terminal)
        assert torch.equal(plan.sigmas, expected)
        s = SampleSettings(height=32, width=32, steps=8, eta=0.0, shift=2.0, batch_size=1, num_images_per_prompt=1,
                           terminal=terminal)
        assert torch.equal(eval_plan(s).sigmas, on_grid(ode_plan(8, 2.0), "shifted_linspace", 8, 2.0, terminal).sigmas)
    assert float(plan.sigmas[-2]) == pytest.approx(0.02, abs=1e-7)


def test_a_bad_terminal_is_refused():
    with pytest.raises(ValueError, match="shift_terminal must lie in"):
        sde.stretch_to_terminal(sde.sigma_schedule(4, 3.0), 1.0)
