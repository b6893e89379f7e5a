"""The cost_model CLI: table, JSON, utilisation and model resolution."""

import json
import subprocess
import sys

import pytest

from fastvideo.perf import flops as F
from fastvideo.models.flux import flops as FX
from fastvideo.tools import cost_model
from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config, vae_config


def _run(capsys, *argv) -> str:
    cost_model.main(list(argv))
    return capsys.readouterr().out


def _refused(capsys, *argv) -> str:
    """A user error: exit 2 and one line on stderr, which is returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cost_model.main(list(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    return err


def test_default_is_the_reference_iteration(capsys):
    out = _run(capsys)
    total = F.iteration_flops(F.IterationShape()).hardware_flops
    assert "FLUX.1-dev" in out and "192 samples" in out and "9 trained steps" in out
    assert "total (hardware, HFU)" in out and F.human(total) in out
    assert "3072 forwards" in out and "1728 backwards" in out


def test_mfu_from_a_measured_time(capsys):
    out = _run(capsys, "--seconds_per_iteration", "216", "--device_name", "H800")
    it = F.iteration_flops(F.IterationShape())
    mfu = it.model_flops / (216 * 16 * 989.4e12)
    hfu = it.hardware_flops / (216 * 16 * 989.4e12)
    assert f"MFU {100 * mfu:.1f} %" in out and f"HFU {100 * hfu:.1f} %" in out
    out = _run(capsys, "--seconds_per_iteration", "310")
    assert "pass --peak_tflops" in out
    assert "no peak known" in _refused(capsys, "--seconds_per_iteration", "1", "--device_name", "mystery chip")


def test_json_and_overrides(capsys):
    out = _run(capsys, "--json", "--world_size", "32", "--sampling_steps", "25", "--trained_steps", "4",
               "--no-gradient_checkpointing", "--seconds_per_iteration", "151", "--peak_tflops", "989.4")
    s = json.loads(out)
    shape = F.IterationShape(sampling_steps=25, world_size=32, trained_steps=4, gradient_checkpointing=False)
    it = F.iteration_flops(shape)
    assert s["samples"] == 384 and s["trained_steps"] == 4
    assert s["flops"]["recompute"] == 0 and s["flops"]["hardware_total"] == it.hardware_flops
    assert s["mfu"] == pytest.approx(F.utilisation(it.model_flops, 151, 32, 989.4))
    s = json.loads(_run(capsys, "--json", "--train_last_step", "--sampling_steps", "10", "--timestep_fraction", "0.5"))
    assert s["trained_steps"] == 5


def test_presets_and_paths(tmp_path, capsys):
    s = json.loads(_run(capsys, "--json", "--model", "tiny", "--h", "64", "--w", "64", "--text_tokens", "32"))
    tiny = transformer_config(PRESETS["tiny"])
    assert s["forward_breakdown"]["total"] == FX.transformer_forward_flops(tiny, 16, 32)
    # a diffusers folder: transformer/config.json and vae/config.json beside it
    (tmp_path / "transformer").mkdir()
    (tmp_path / "vae").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(tiny))
    (tmp_path / "vae" / "config.json").write_text(json.dumps(vae_config(PRESETS["tiny"])))
    s2 = json.loads(_run(capsys, "--json", "--model", str(tmp_path), "--h", "64", "--w", "64", "--text_tokens", "32"))
    assert s2["flops"] == s["flops"]
    assert "no such file" in _refused(capsys, "--model", str(tmp_path / "missing"))
    assert "multiple of 16" in _refused(capsys, "--h", "700")


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "fastvideo.tools.cost_model", "--world_size", "8"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert "96 samples" in out and "total (model, MFU)" in out


def test_an_explicit_model_family_prints_the_same_and_an_unknown_one_fails_in_one_line(capsys):
    assert _run(capsys, "--model_family", "flux") == _run(capsys)
    assert _run(capsys, "--model_family", "flux", "--model", "reference", "--json") == _run(capsys, "--json")
    with pytest.raises(SystemExit) as exc:
        cost_model.main(["--model_family", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model family 'nope'" in err and "valid: flux" in err


def test_a_training_command_lines_flags_are_accepted_and_the_ignored_ones_named(capsys):
    """The flags of a launcher's line: cost flags are read, the others named once as ignored;
    --t is no longer an ambiguous prefix; unmodelled cost flags and unknown flags are refused."""
    args = cost_model.parse_args(["--seed", "42", "--use_hpsv2", "--t", "1", "--h", "512", "--num_generations", "8",
                                  "--cache_dir=data/.cache", "--use_group", "--train_batch_size", "2"])
    assert (args.h, args.num_generations, args.prompts_per_rank, args.text_tokens) == (512, 8, 2, 512)
    err = capsys.readouterr().err
    assert "no effect on the cost, ignored: --seed, --use_hpsv2, --t, --cache_dir, --use_group" in err
    cost_model.parse_args(["--kl_coeff", "0.1", "--lora_alpha", "8"])  # MixGRPO's KL reuses stored log-probs
    assert "ignored: --kl_coeff, --lora_alpha" in capsys.readouterr().err
    for bad, needle in ((["--use_lora"], "not modelled"), (["--sp_size", "2"], "not modelled"),
                        (["--bogus", "1"], "neither a cost-model nor a training flag")):
        with pytest.raises(SystemExit):
            cost_model.parse_args(bad)
        assert needle in capsys.readouterr().err


def test_tiny_preset_follows_the_model_family():
    """--model tiny with --model_family sd3 is the tiny SD3.5 builder's shape, not FLUX's preset."""
    from fastvideo.errors import ConfigError
    from fastvideo.models.registry import get_model_family
    from fastvideo.tools import make_tiny_flux, make_tiny_sd3
    from fastvideo.tools.cost_model import resolve_model

    config, vae, desc = resolve_model("tiny", get_model_family("sd3"))
    assert config == make_tiny_sd3.transformer_config() and vae == make_tiny_sd3.vae_config() and "SD3" in desc
    flux, _, _ = resolve_model("tiny", get_model_family("flux"))
    assert flux == make_tiny_flux.transformer_config(make_tiny_flux.PRESETS["tiny"])
    with pytest.raises(ConfigError, match="FLUX preset"):
        resolve_model("small", get_model_family("sd3"))
