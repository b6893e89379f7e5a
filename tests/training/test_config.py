import json
import shlex
import subprocess
from pathlib import Path

import pytest

from fastvideo.config import FILE_FLAGS, ConfigError, build_parser, parse_config, validate_args

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility"]


def _validate(*extra):
    return validate_args(build_parser().parse_args(BASE + list(extra)))


@pytest.mark.parametrize("flags, message", [
    (["--sp_size", "0"], "must be >= 1"),
    (["--num_generations", "1", "--use_group"], "at least 2 samples"),
    (["--reward_group_norm"], "needs --use_group"),
    (["--train_last_step", "--ignore_last"], "contradict"),
    (["--sampling_steps", "1"], "too small"),
    (["--h", "100"], "multiples of 16"),
    (["--timestep_fraction", "0"], r"must be in \(0, 1\]"),
    (["--timestep_fraction", "1.5"], r"must be in \(0, 1\]"),
    (["--cfg", "4.5"], "classifier-free guidance is not supported"),
    (["--t", "4"], "for images"),
    (["--mixed_precision", "fp16"], "fp16 is not supported"),
    (["--eta", "0"], "eta > 0"),
    (["--lr_scheduler", "cosine_wobble"], "is unknown; choose from"),
    (["--use_cpu_offload", "--fsdp_sharding_strategy", "none"], "needs FSDP sharding"),
    (["--dump_randomness", "a", "--load_randomness", "b"], "cannot be used together"),
    (["--probe_layers", "rope,bogus", "--record_dir", "r"], "unknown kind"),
    (["--probe_layers", "rope"], "needs --record_dir"),
    (["--use_hpsv2"], "either with --rewards or with --use_hpsv2"),
    (["--rewards", "hpsv2:1,nonsense:2"], "nonsense"),
    (["--selective_checkpointing", "0.5"], "needs --gradient_checkpointing"),
    (["--fsdp_param_dtype", "bf16", "--mixed_precision", "no"], "needs --mixed_precision bf16"),
    (["--fsdp_forward_prefetch", "--fsdp_sharding_strategy", "none"], "is an FSDP setting"),
    (["--fsdp_param_dtype", "bf16", "--mixed_precision", "bf16", "--fsdp_sharding_strategy", "none"],
     "is an FSDP setting"),
])
def test_bad_flags_fail_with_their_message(flags, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        _validate(*flags)


def test_no_reward_is_an_early_clear_error(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m"])
    assert "no reward given" in capsys.readouterr().err


def test_legacy_aliases_and_derived_quantities():
    cfg = validate_args(build_parser().parse_args(
        ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--use_hpsv2",
         "--num_generations", "12", "--train_batch_size", "1", "--train_micro_batch_size", "1",
         "--gradient_accumulation_steps", "4", "--sampling_steps", "16", "--timestep_fraction", "0.6",
         "--ignore_last", "--cache_dir", "x", "--use_group"]))
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("hpsv2", 1.0)]
    d = cfg.derived(world_size=16)
    assert d["train_global_batch_size"] == 64  # the recipe's 1 x 4 x 16
    assert d["trained_steps_per_sample"] == 9  # int(15 * 0.6)
    assert d["samples_per_iteration"] == 192
    assert d["optimizer_steps_per_iteration"] == 3
    assert any("--cache_dir" in n and "no effect" in n for n in cfg.compat_notes)


LAUNCHERS = [
    "scripts/finetune/finetune_flux_grpo_a3_16die.sh",
    "scripts/finetune/finetune_flux_grpo_8gpus.sh",
    "scripts/finetune/finetune_flux_grpo.sh",
    "scripts/demo/grpo_tiny_cpu.sh",
    "scripts/finetune/finetune_flux_nft_8gpus.sh",
    "scripts/finetune/finetune_flux_nft_a3_16die.sh",
    "scripts/finetune/finetune_sd3_nft_8gpus.sh",
    "scripts/finetune/finetune_sd3_nft_a3_16die.sh",
] + [f"scripts/finetune/finetune_flux_{o}_{n}.sh" for o in ("awm", "dgpo", "flash_grpo", "grpo_guard")
     for n in ("8gpus", "a3_16die")]


@pytest.mark.parametrize("script", LAUNCHERS)
def test_launcher_dry_run_is_accepted_by_the_parser(script):
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin"}
    import os
    import sys

    env["PYTHON"] = sys.executable
    env["HOME"] = os.environ.get("HOME", "/root")
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    from fastvideo.library_lines import line_summary

    assert out.stdout.splitlines()[0] == f"device: cpu; cann: none; line: {line_summary()}"
    line = [ln for ln in out.stdout.splitlines() if "train_grpo_flux.py" in ln][-1]
    words = shlex.split(line)
    argv = words[words.index(next(w for w in words if w.endswith("train_grpo_flux.py"))) + 1:]
    cfg = validate_args(build_parser(argv).parse_args(argv))  # as the entry point: --algorithm's own flags too
    assert cfg.rollout.num_generations >= 2


def test_upstream_defaults_for_behaviour():
    cfg = _validate("--num_generations", "12")
    # Without --use_group: one sample per prompt (upstream L474-490), said in a start-up note.
    assert cfg.rollout.num_generations == 1 and not cfg.grpo.use_group
    assert any("--num_generations 12 has no effect without --use_group" in n for n in cfg.compat_notes)
    grouped = _validate("--num_generations", "12", "--use_group")
    assert grouped.rollout.num_generations == 12 and not grouped.compat_notes
    # The last transition is never trained unless asked: T = int((N - 1) * fraction).
    assert cfg.grpo.candidate_steps(16) == 15 and cfg.grpo.trained_steps(16) == 9
    last = _validate("--train_last_step")
    assert last.grpo.candidate_steps(16) == 16 and last.grpo.trained_steps(16) == 9
    assert _validate("--train_last_step", "--timestep_fraction", "1").grpo.trained_steps(16) == 16
    assert _validate("--ignore_last").grpo.candidate_steps(16) == 15
    assert cfg.grpo.adv_std == "sample" and cfg.reward.precision == "auto"
    assert _validate("--adv_std", "population").grpo.adv_std == "population"
    assert not cfg.output.resume_allow_changes and _validate("--resume_allow_changes").output.resume_allow_changes


def test_reward_precision_maps_to_autocast_dtypes():
    import torch

    from fastvideo.rewards.compressibility import JpegCompressibilityReward as CompressibilityReward
    from fastvideo.training.builders import reward_dtype

    assert reward_dtype("auto") is None and reward_dtype("fp16") is torch.float16
    assert reward_dtype("bf16") is torch.bfloat16 and reward_dtype("fp32") is torch.float32
    # auto: float16 on an accelerator (upstream's torch.amp.autocast default), float32 on the CPU.
    assert CompressibilityReward(device="cpu").compute_dtype is torch.float32
    assert CompressibilityReward(device="meta").compute_dtype is torch.float32
    assert CompressibilityReward(device="cpu", dtype=torch.bfloat16).compute_dtype is torch.bfloat16


def test_reward_autocast_is_float16_on_an_accelerator(monkeypatch):
    import torch

    from fastvideo import devices
    from fastvideo.rewards.compressibility import JpegCompressibilityReward as CompressibilityReward

    seen = []
    monkeypatch.setattr(devices, "is_accelerator", lambda device: True)
    monkeypatch.setattr(devices, "autocast", lambda device, dtype=None, enabled=True: seen.append(dtype))
    r = CompressibilityReward(device="cpu")
    assert r.compute_dtype is torch.float16
    r.autocast()
    assert seen == [torch.float16]


def _launcher_flags(script) -> dict:
    """The DRY_RUN command line of a launcher as {flag: value or True}."""
    import os
    import sys

    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    words = shlex.split([ln for ln in out.stdout.splitlines() if "train_grpo_flux.py" in ln][-1])
    argv = words[words.index(next(w for w in words if w.endswith("train_grpo_flux.py"))) + 1:]
    flags, i = {}, 0
    while i < len(argv):
        name = argv[i].removeprefix("--")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name], i = argv[i + 1], i + 2
        else:
            flags[name], i = True, i + 1
    return flags


# Upstream DanceGRPO 15cc71d scripts/finetune/finetune_flux_grpo_8gpus.sh, flag for flag.
UPSTREAM_8GPU = {
    "seed": "42", "pretrained_model_name_or_path": "data/flux", "vae_model_path": "data/flux",
    "cache_dir": "data/.cache", "data_json_path": "data/rl_embeddings/videos2caption.json",
    "gradient_checkpointing": True, "train_batch_size": "2", "num_latent_t": "1", "sp_size": "1",
    "train_sp_batch_size": "2", "dataloader_num_workers": "4", "gradient_accumulation_steps": "12",
    "max_train_steps": "300", "learning_rate": "1e-5", "mixed_precision": "bf16", "checkpointing_steps": "40",
    "allow_tf32": True, "cfg": "0.0", "output_dir": "data/outputs/grpo", "h": "720", "w": "720", "t": "1",
    "sampling_steps": "16", "eta": "0.3", "lr_warmup_steps": "0", "sampler_seed": "1223627",
    "max_grad_norm": "0.01", "weight_decay": "0.0001", "use_hpsv2": True, "num_generations": "12", "shift": "3",
    "use_group": True, "ignore_last": True, "timestep_fraction": "0.6", "clip_range": "1e-4",
    "adv_clip_max": "5.0", "use_ema": True, "ema_decay": "0.995", "init_same_noise": True,
}
# The Ascend recipe's A3 16-die run (the recipe's reference configuration, from cann-recipes-train multimodal_rl/flux_grpo's
# finetune_flux_grpo_a3_16die.sh): train GBS 1 x 4 x 16, rollout batch 4, max_grad_norm 1.0.
RECIPE_A3_16DIE = {
    **{k: v for k, v in UPSTREAM_8GPU.items() if k not in ("use_ema", "ema_decay")},
    "train_batch_size": "1", "train_sp_batch_size": "1", "gradient_accumulation_steps": "4",
    "max_grad_norm": "1.0", "rollout_batch_size": "4", "train_micro_batch_size": "1",
}
# The communication-lean options every multi-device launcher adds (scripts/common.sh LEAN_ARGS, issue #37;
# LEAN=0 drops them): bf16 gathers, the rollout's weights gathered once and all trained timesteps in one
# update forward where the memory model says they fit (the same rewards; gradients to 1e-6 in fp32).
LEAN = {"fsdp_param_dtype": "bf16", "rollout_weights": "auto", "update_timesteps_per_forward": "all"}
# Flags a launcher may add to its source's, each for a stated reason.
ADDED = {
    "scripts/finetune/finetune_flux_grpo_8gpus.sh": {
        # The recipe's 8-die adaptation batches the rollout 4 at a time; trajectories are the same.
        "rollout_batch_size": "4", "train_micro_batch_size": "1", **LEAN},
    "scripts/finetune/finetune_flux_grpo_a3_16die.sh": {**LEAN},
}


# Flags of the source a launcher leaves out: accepted for compatibility and without effect here, so a
# launcher passing them printed "has no effect" at every start (issue #52 item 3).
DROPPED = ("cache_dir", "train_sp_batch_size", "ignore_last")


@pytest.mark.parametrize("script, source", [
    ("scripts/finetune/finetune_flux_grpo_8gpus.sh", UPSTREAM_8GPU),
    ("scripts/finetune/finetune_flux_grpo_a3_16die.sh", RECIPE_A3_16DIE),
])
def test_reference_launchers_pass_their_sources_flags(script, source):
    assert _launcher_flags(script) == {**{k: v for k, v in source.items() if k not in DROPPED}, **ADDED[script]}
    # each one left out is accepted and does nothing here: passing it printed "has no effect" in every run
    for flag in (f for f in DROPPED if str(build_parser().get_default(f)) != str(source[f])):  # not a default
        given = [f"--{flag}"] + ([] if source[flag] is True else [str(source[flag])])
        assert any(f"--{flag}" in n and "no effect" in n for n in _validate(*given).compat_notes), flag


# ---------------------------------------------------------------- every flag does something, or says it does not
def _non_default(action, default):
    """A value for ``action`` other than the parser's default, or None when there is none."""
    import argparse

    if isinstance(action, argparse._StoreTrueAction):
        return []
    if action.choices:
        other = [c for c in action.choices if c != default]
        return [str(other[0])] if other else None
    if action.type is int:
        return [str((default or 0) + 2)]
    if action.type is float:
        return [str((default or 0.0) + 0.5)]
    return ["x" if default is None else f"{default}_x"]


def _outcome(argv):
    try:
        cfg = validate_args(build_parser().parse_args(argv))
    except ConfigError as exc:
        return "error", str(exc)
    d = cfg.to_dict()
    return d.pop("compat_notes"), d


def test_every_flag_works_is_refused_or_noted():
    """Each flag given a non-default value changes the config, or fails with a reason, or is named
    in a start-up note: none is parsed and silently ignored."""
    parser = build_parser()
    start = BASE + ["--use_group"]
    base_notes, base = _outcome(start)
    assert base_notes == []
    silent = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.option_strings[0] == "--use_group":
            continue
        if action.dest in FILE_FLAGS:  # how the configuration is read or shown (tests/training/test_config_file.py)
            continue
        value = _non_default(action, parser.get_default(action.dest))
        if value is None:  # a single accepted value (e.g. --advantage_rerange_strategy null)
            continue
        flag = action.option_strings[0]
        notes, cfg = _outcome(start + [flag, *value])
        if notes == "error":
            continue
        if cfg == base and not any(flag in n for n in notes):
            silent.append(flag)
    assert silent == []


@pytest.mark.parametrize("flags, note", [
    (["--unified_reward_num_workers", "4"], "--unified_reward_num_workers is accepted for MixGRPO compatibility"),
    (["--drop_last_sample"], "--drop_last_sample is accepted for MixGRPO compatibility and has no effect"),
    (["--unified_reward_default_question_type", "semantic"], "--unified_reward_default_question_type is accepted"),
    (["--image_reward_med_config", "m/med_config.json"], "--image_reward_med_config"),
    (["--ignore_last"], "--ignore_last is accepted for compatibility"),
    (["--lora_rank", "4"], "--lora_rank have no effect without --use_lora"),
    (["--eval_steps", "4"], "--eval_steps have no effect without --eval_every"),
    (["--hps_weight", "2"], "--hps_weight: accepted for MixGRPO compatibility, no effect here"),
    (["--ema_decay", "0.9"], "--ema_decay: no effect without --use_ema"),
    (["--lr_power", "2"], "--lr_power: no effect with --lr_scheduler constant_with_warmup"),
    (["--lr_warmup_steps", "5", "--lr_scheduler", "constant"], "--lr_warmup_steps: no effect with --lr_scheduler constant"),
    (["--pickscore_dir", "x"], "--pickscore_dir x has no effect without the pickscore reward"),
    (["--use_group", "--algorithm", "nft", "--kl_coeff", "0.1", "--train_last_step"],
     "--kl_coeff, --train_last_step: no effect with --algorithm nft"),
])
def test_flags_without_effect_are_noted_once(flags, note):
    cfg = _validate(*flags)
    assert sum(note in n for n in cfg.compat_notes) == 1, cfg.compat_notes


def test_image_reward_med_config_must_be_the_one_imagereward_reads(tmp_path):
    mix = ["--reward_model", "image_reward", "--use_group", "--image_reward_path", str(tmp_path / "ImageReward.pt")]
    argv = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", *mix]
    ok = validate_args(build_parser().parse_args(argv + ["--image_reward_med_config",
                                                         str(tmp_path / "med_config.json")]))
    assert ok.reward.extras.image_reward_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="reads med_config.json from its folder"):
        validate_args(build_parser().parse_args(argv + ["--image_reward_med_config", "/elsewhere/med_config.json"]))


def test_parsing_reads_args_and_never_writes_them(tmp_path):
    import copy

    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "COMPLETE.json").write_text("{}")
    for extra in (["--use_lora", "--resume_from_lora_checkpoint", str(tmp_path / "checkpoint-2")],
                  ["--use_hpsv2", "--use_pickscore"],
                  ["--reward_model", "hpsv2", "--use_group", "--hps_path", "/h/HPS_v2.1_compressed.pt"]):
        argv = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", *extra]
        args = build_parser().parse_args(argv if "--rewards" in extra or "--use_hpsv2" in extra
                                         or "--reward_model" in extra else argv + ["--rewards", "compressibility"])
        before = copy.deepcopy(vars(args))
        cfg = validate_args(args)
        assert vars(args) == before
    assert cfg.reward.hps_ckpt_dir == "/h"


def test_model_family_and_algorithm_are_stored():
    cfg = _validate()
    assert cfg.model.family == "flux" and cfg.algorithm == "grpo"
    d = cfg.to_dict()
    assert d["model"]["family"] == "flux" and d["algorithm"] == "grpo"
    plugin = _validate("--model_family", "my_pkg.models:Sd3Family", "--algorithm", "my_pkg.algos:DPO")
    assert plugin.model.family == "my_pkg.models:Sd3Family" and plugin.algorithm == "my_pkg.algos:DPO"
    for flag in ("--model_family", "--algorithm"):
        with pytest.raises(ConfigError, match=f"{flag} 'a:b:c'"):
            _validate(flag, "a:b:c")


def test_run_identity_treats_a_missing_new_key_as_its_default():
    from fastvideo.training.run.identity import identity_differences, run_identity

    now = run_identity(_validate(), 1)
    old = {k: v for k, v in now.items() if k not in ("model_family", "algorithm")}  # a 919d5af checkpoint
    assert identity_differences(old, now) == []
    other = run_identity(_validate("--model_family", "pkg.m:Other"), 1)
    assert identity_differences(old, other) == [
        "model_family (--model_family): checkpoint 'flux', this run 'pkg.m:Other'"]


def test_every_component_follows_the_settings_convention():
    from fastvideo.config import COMPONENTS
    from fastvideo.settings import Settings

    parser = build_parser()
    args = parser.parse_args(BASE)
    for name, component in COMPONENTS:
        assert issubclass(component, Settings), name
        for method in ("add_flags", "from_args"):  # each declares its own flags and builds itself
            assert getattr(component, method).__func__ is not getattr(Settings, method).__func__, (name, method)
        built = component.from_args(args)
        assert built is None or isinstance(built, component), name  # None: evaluation off


def test_start_up_notes_are_printed_once(tmp_path, capsys):
    """Each note is one [config] line, not repeated inside the printed configuration (rank 0 prints)."""
    import types

    from fastvideo.training.run.start import log_config

    cfg = _validate("--output_dir", str(tmp_path), "--lora_rank", "4", "--ema_decay", "0.9")
    log_config(cfg, types.SimpleNamespace(world_size=2), "cpu")
    out = capsys.readouterr().out
    for note in ("--lora_rank have no effect without --use_lora", "--ema_decay: no effect without --use_ema"):
        assert out.count(note) == 1, out
    assert json.loads((tmp_path / "config.json").read_text())["compat_notes"] == cfg.compat_notes
