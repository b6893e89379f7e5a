"""The NFT launchers against DiffusionNFT's SD3.5 configuration (tests/fixtures/upstream_nft_config.json):
one optimizer step over 48 groups x 24 samples (1,152) per iteration on 8 and on 16 ranks, no CFG for
SD3.5, the EMA warmed up and exported; and the start-up note for SD3 + NFT with CFG on (#39 items 3, 5)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo.config import build_parser, validate_args

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((ROOT / "tests" / "fixtures" / "upstream_nft_config.json").read_text())
LAUNCHERS = {"finetune_flux_nft_8gpus.sh": ("flux", 8), "finetune_flux_nft_a3_16die.sh": ("flux", 16),
             "finetune_sd3_nft_8gpus.sh": ("sd3", 8), "finetune_sd3_nft_a3_16die.sh": ("sd3", 16)}


def _argv(script: str, **env) -> tuple[list[str], subprocess.CompletedProcess]:
    full = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
            "HOME": os.environ.get("HOME", "/root"), **env}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "finetune" / script)], capture_output=True, text=True,
                         env=full, cwd=ROOT, timeout=120)
    if out.returncode != 0:
        return [], out
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    return words[words.index("fastvideo/train_grpo_flux.py") + 1:], out


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_one_optimizer_step_covers_the_references_48_groups(script):
    family, ranks = LAUNCHERS[script]
    argv, out = _argv(script)
    assert f"--nproc_per_node={ranks}" in out.stdout
    cfg = validate_args(build_parser().parse_args(argv))
    derived = cfg.derived(ranks)
    G = cfg.rollout.num_generations
    assert G == REF["num_image_per_prompt"]["value"]
    assert derived["optimizer_steps_per_iteration"] == REF["gradient_step_per_epoch"]["value"]
    samples_per_step = ranks * cfg.prompts_per_rank * G // derived["optimizer_steps_per_iteration"]
    assert samples_per_step == REF["num_groups"]["value"] * G == 1152
    assert cfg.model.family == family and cfg.algorithm == "nft"
    assert (cfg.optim.use_ema, cfg.optim.ema_decay, cfg.optim.ema_warmup, cfg.optim.export_ema) == \
        (True, REF["ema"]["decay"], True, True)
    r = cfg.rollout
    assert (r.height, r.sampling_steps, r.decode_from) == (REF["resolution"]["value"], REF["num_steps"]["value"],
                                                         "final_sample")
    assert (cfg.nft.beta, cfg.nft.decay_type, cfg.grpo.timestep_fraction, cfg.grpo.kl_coef) == \
        (REF["beta"]["value"], REF["decay_type"]["value"], REF["timestep_fraction"]["value"],
         REF["train_beta_kl"]["value"])
    if family == "sd3":  # the reference's own model: its guidance, grid and timesteps
        assert (r.guidance_scale, r.sigma_grid, r.quantize_timestep) == (REF["guidance_scale"]["value"], "diffusers",
                                                                         False)
        assert not any("guidance" in note for note in cfg.compat_notes)


def test_groups_that_do_not_split_over_the_ranks_are_one_line():
    _, out = _argv("finetune_sd3_nft_8gpus.sh", NFT_GROUPS="44")
    assert out.returncode == 2
    assert out.stderr.strip() == ("NFT_GROUPS=44 prompt groups per optimizer step must be a multiple of NPROC=8 "
                                  "(a group stays on one rank)")


def test_sd3_nft_with_classifier_free_guidance_is_noted():
    base = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
            "--algorithm", "nft", "--use_group"]
    notes = validate_args(build_parser().parse_args(base + ["--model_family", "sd3"])).compat_notes
    assert any("--guidance_scale 3.5 runs classifier-free guidance" in n and "guidance 1.0" in n for n in notes)
    for quiet in (["--model_family", "sd3", "--guidance_scale", "1"], []):  # no CFG; FLUX's embedding is no CFG
        notes = validate_args(build_parser().parse_args(base + quiet)).compat_notes
        assert not any("classifier-free" in n for n in notes), quiet
