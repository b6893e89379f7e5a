"""AdamW kernels through the device layer (devices.adamw_kernel_kwargs, --adamw_kernel): the same
optimizer state whichever kernel ran, so a checkpoint moves between them; updates agree to rounding."""

from __future__ import annotations

import pytest
import torch

from fastvideo import devices


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))


def _steps(model, opt, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(4, 7, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _opt(model, kernel):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4, eps=1e-8,
                             **devices.adamw_kernel_kwargs("cpu", kernel))


KERNELS = ("fused", "foreach", "loop")


def test_same_state_layout_and_close_updates():
    runs = {}
    for kernel in KERNELS:
        model = _model()
        opt = _opt(model, kernel)
        _steps(model, opt, 3)
        runs[kernel] = (model, opt.state_dict())
    ref_model, ref = runs["loop"]
    for kernel in KERNELS:
        model, sd = runs[kernel]
        assert sd["state"].keys() == ref["state"].keys()
        for i, state in sd["state"].items():
            assert state.keys() == ref["state"][i].keys() == {"step", "exp_avg", "exp_avg_sq"}
            for k, v in state.items():
                assert v.shape == ref["state"][i][k].shape and v.dtype == ref["state"][i][k].dtype, (kernel, k)
                torch.testing.assert_close(v, ref["state"][i][k], rtol=1e-5, atol=1e-7)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert bool(sd["param_groups"][0]["fused"]) == (kernel == "fused")


@pytest.mark.parametrize("written, read", [("fused", "foreach"), ("foreach", "fused"), ("loop", "fused")])
def test_a_checkpoint_written_with_one_kernel_resumes_with_another(written, read, tmp_path):
    model = _model()
    opt = _opt(model, written)
    _steps(model, opt, 2)
    path = tmp_path / "opt.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    _steps(model, opt, 2, seed=5)  # the writer's own continuation

    saved = torch.load(path, weights_only=True)
    other = _model()
    other.load_state_dict(saved["model"])
    opt2 = _opt(other, read)
    opt2.load_state_dict(saved["opt"])
    # the reader keeps its own kernel (load_state_dict takes the saved group's flags: reset them)
    for group in opt2.param_groups:
        group.update({k: v for k, v in devices.adamw_kernel_kwargs("cpu", read).items()})
    _steps(other, opt2, 2, seed=5)
    assert bool(opt2.state_dict()["param_groups"][0]["fused"]) == (read == "fused")
    for p, q in zip(other.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_kernel_choice_per_device(monkeypatch):
    assert devices.adamw_kernel_kwargs("cpu") == {"fused": True, "foreach": None}  # today's CPU default
    assert devices.adamw_kernel_kwargs("cuda") == {"fused": True, "foreach": None}
    assert devices.adamw_kernel_kwargs("cpu", "loop") == {"fused": False, "foreach": False}
    # NPU: fused only where torch_npu registers aten::_fused_adamw_ for its dispatch key
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", lambda op, key: False)
    assert devices.adamw_kernel_kwargs("npu") == {"fused": None, "foreach": True}
    with pytest.raises(ValueError, match="not available on npu; use --adamw_kernel foreach"):
        devices.adamw_kernel_kwargs("npu", "fused")
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key",
                        lambda op, key: (op, key) == ("aten::_fused_adamw_", "PrivateUse1"))
    assert devices.adamw_kernel_kwargs("npu") == {"fused": True, "foreach": None}
    with pytest.raises(ValueError, match="unknown AdamW kernel"):
        devices.adamw_kernel_kwargs("cpu", "apex")


def test_flag_reaches_the_optimizer():
    from fastvideo.config import build_parser, validate_args
    from fastvideo.training.builders import build_optimizer

    base = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility"]
    for kernel, fused, foreach in (("auto", True, None), ("loop", False, False), ("foreach", None, True)):
        cfg = validate_args(build_parser().parse_args(base + ["--adamw_kernel", kernel]))
        opt, _ = build_optimizer(cfg, _model())
        group = opt.param_groups[0]
        assert (group["fused"], group["foreach"]) == (fused, foreach)
