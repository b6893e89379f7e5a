import pytest
import torch

from fastvideo.grpo.advantages import batch_advantages, group_advantages, zero_std_ratio
from fastvideo.grpo.loss import clipped_policy_loss, timestep_selection


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    adv = group_advantages(r, 3, clip_max=5.0)
    sample_std = 1.0  # sqrt(((1-2)^2 + 0 + (3-2)^2) / (3 - 1)): upstream's group_rewards.std()
    assert torch.allclose(adv[:3], torch.tensor([-1 / sample_std, 0.0, 1 / sample_std]), atol=1e-6)
    assert torch.equal(adv[3:], torch.zeros(3))
    pop = group_advantages(r, 3, clip_max=5.0, unbiased=False)  # --adv_std population
    pop_std = (2.0 / 3.0) ** 0.5
    assert torch.allclose(pop[:3], torch.tensor([-1 / pop_std, 0.0, 1 / pop_std]), atol=1e-6)
    assert zero_std_ratio(r, 3).item() == 0.5
    assert group_advantages(torch.tensor([0.0, 0.0, 0.0, 100.0]), 4, clip_max=1.0).max().item() == 1.0
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.ones(6), 4, 5.0)


def test_batch_advantages_use_the_sample_std():
    r = torch.randn(12, generator=torch.Generator().manual_seed(0))
    a = batch_advantages(r, 100.0)
    assert abs(a.mean().item()) < 1e-6 and abs(a.std(unbiased=True).item() - 1) < 1e-5
    b = batch_advantages(r, 100.0, unbiased=False)
    assert abs(b.std(unbiased=False).item() - 1) < 1e-5
    torch.testing.assert_close(a, (r - r.mean()) / (r.std() + 1e-8))
    with pytest.raises(ValueError, match="at least 2"):
        batch_advantages(torch.ones(1), 5.0)


def test_clipped_loss_matches_hand_formula():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.00005]))
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0])
    eps = 1e-4
    loss, stats = clipped_policy_loss(new, old, adv, eps)
    ratio = torch.tensor([1.0, 1.5, 0.5, 1.00005])
    expected = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps)).mean()
    assert torch.allclose(loss, expected)
    # sample 2: A=1, ratio 1.5 -> min objective uses clipped 1+eps: -1*(1+eps) vs -1.5 -> max is -(1+eps)
    assert stats.clip_fraction.item() == 0.5
    assert torch.allclose(stats.ratio_abs_dev_max, torch.tensor(0.5))


def test_ratio_one_gives_minus_mean_advantage_and_gradient():
    lp = torch.randn(5, requires_grad=True)
    adv = torch.randn(5)
    loss, stats = clipped_policy_loss(lp, lp.detach(), adv, 1e-4)
    assert torch.allclose(loss, -adv.mean()) and stats.ratio_abs_dev_max.item() == 0.0
    loss.backward()
    assert torch.allclose(lp.grad, -adv / 5)


def test_timestep_selection():
    perms = torch.tensor([[3, 1, 0, 2], [0, 2, 3, 1]])
    assert torch.equal(timestep_selection(perms, 2), torch.tensor([[3, 1], [0, 2]]))
