"""--ema_warmup (Flow-GRPO's and DiffusionNFT's EMAModuleWrapper decay) and --export_ema (DiffusionNFT
saves the EMA weights as its checkpoint). Upstream's facts: tests/fixtures/upstream_ema.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from dist_utils import tiny_transformer

from fastvideo.distributed import fsdp
from fastvideo.training.ema import EMA

FACTS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "upstream_ema.json").read_text())
DECAY = 0.9  # DiffusionNFT's and Flow-GRPO's


def upstream_decay(step: int, decay: float) -> float:
    """get_current_decay, upstream's own expression (the fixture's text) evaluated."""
    return eval(FACTS["decay_expression"], {}, {"optimization_step": step, "self": SimpleNamespace(decay=decay)})


def upstream_ema(start: dict, seq: list[dict], steps: list[int], decay: float) -> dict:
    """EMAModuleWrapper.step(parameters, optimization_step) over seq (interval 1), in float64."""
    ema = {k: v.double().clone() for k, v in start.items()}
    for weights, step in zip(seq, steps):
        one_minus_decay = 1 - upstream_decay(step, decay)
        for name, ema_parameter in ema.items():
            ema_parameter.add_(one_minus_decay * (weights[name].double() - ema_parameter))
    return ema


def test_the_warm_up_is_upstreams_decay():
    ema = EMA(tiny_transformer(), decay=DECAY, warmup=True)
    got = [ema.decay_at(s) for s in range(0, 100)]
    assert got == [upstream_decay(s, DECAY) for s in range(0, 100)]
    assert got[1] == pytest.approx(2 / 11) and got[79] < DECAY == got[80]  # (1 + s) / (10 + s) reaches 0.9 at s = 80
    assert EMA(tiny_transformer(), decay=DECAY).decay_at(1) == DECAY  # off: the constant decay


def test_warmed_up_updates_equal_upstreams_wrapper():
    model = tiny_transformer()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    seq = [{n: torch.randn(p.shape, generator=g) for n, p in start.items()} for _ in range(4)]
    steps = [1, 2, 3, 4]  # DiffusionNFT: global_step after its increment
    ema = EMA(model, decay=DECAY, warmup=True)
    for weights, step in zip(seq, steps):
        model.load_state_dict(weights)
        ema.update(model, step=step)
    want = upstream_ema(start, seq, steps, DECAY)
    got = ema.full_state_dict(model)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-6, rtol=1e-6, msg=name)
    constant = upstream_ema(start, seq, [10**9] * 4, DECAY)  # the decay without warm-up
    assert max((constant[n] - want[n]).abs().max() for n in want) > 0.1


def test_the_trainer_warms_up_on_optimizer_steps(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """Two optimizer steps per iteration: the update after iteration i uses s = 2 i (upstream's
    global_step then), from --ema_start_step on."""
    from helpers import single_process_trainer, train_args

    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "ema", use_ema=True, ema_decay=DECAY,
                      ema_warmup=True, ema_start_step=2, num_generations=4, rollout_batch_size=4,
                      train_micro_batch_size=1, gradient_accumulation_steps=2, timestep_fraction=0.34,
                      max_train_steps=3, save_images_every=0, checkpointing_steps=100, fsdp_sharding_strategy="none")
    trainer = single_process_trainer(argv, monkeypatch)
    start = {k: v.clone() for k, v in fsdp.full_model_state_dict(trainer.model).items()}
    after = []
    for _ in range(3):
        assert trainer.run_iteration()["optimizer_steps"] == 2
        after.append({k: v.clone() for k, v in fsdp.full_model_state_dict(trainer.model).items()})
    want = upstream_ema(start, after[1:], [4, 6], DECAY)  # iterations 2 and 3
    got = trainer.ema.full_state_dict(trainer.model)
    for name, value in want.items():
        torch.testing.assert_close(got[name].double(), value, rtol=1e-6, atol=1e-7, msg=name)


def _validate(*extra):
    from fastvideo.config import build_parser, validate_args

    return validate_args(build_parser().parse_args(
        ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility", *extra]))


def test_flags_settings_notes_and_old_configs():
    from fastvideo.component_settings.optim import OptimSettings

    cfg = _validate("--use_ema", "--ema_warmup", "--export_ema")
    assert (cfg.optim.ema_warmup, cfg.optim.export_ema) == (True, True)
    notes = _validate("--ema_warmup", "--export_ema").compat_notes
    assert any("--ema_warmup, --export_ema: no effect without --use_ema" in n for n in notes)
    old = {k: v for k, v in cfg.to_dict()["optim"].items() if k not in ("ema_warmup", "export_ema")}
    flags = OptimSettings.flags_from_resolved(old)
    assert (flags["ema_warmup"], flags["export_ema"]) == (False, False)


def test_a_run_with_export_ema_exports_its_ema_by_default(tmp_path, tiny_flux_dir, capsys):
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file

    from fastvideo.models import flux
    from fastvideo.tools import export
    from fastvideo.training.checkpoint import Checkpointer

    model = flux.load_transformer(tiny_flux_dir)
    ema = EMA(model, decay=DECAY)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    ema.update(model)
    run = tmp_path / "run"
    path = Checkpointer(run).save(1, model=model, ema=ema, transformer_config=dict(model.config))
    policy, averaged = load_file(path / "diffusion_pytorch_model.safetensors"), load_file(path / "ema.safetensors")

    def exported(name, *flags):
        export.main([str(path), str(tmp_path / name), *flags])
        return FluxTransformer2DModel.from_pretrained(tmp_path / name).state_dict()

    assert torch.equal(exported("plain")["proj_out.weight"], policy["proj_out.weight"])  # no config.json: policy
    (run / "config.json").write_text(json.dumps({"optim": {"export_ema": True}, "model": {}, "rollout": {}}))
    assert torch.equal(exported("ema")["proj_out.weight"], averaged["proj_out.weight"])
    assert torch.equal(exported("policy", "--policy")["proj_out.weight"], policy["proj_out.weight"])
    with pytest.raises(SystemExit) as stop:
        export.main([str(path), str(tmp_path / "both"), "--ema", "--policy"])
    assert stop.value.code == 2 and "give one" in capsys.readouterr().err
