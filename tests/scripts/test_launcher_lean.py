"""The launchers' communication-lean options (issue #37, scripts/common.sh LEAN_ARGS): the A3
16-die launcher's own flags (its DRY_RUN=1 command) fed to the cost model move at least 10x fewer
FSDP bytes per rank per iteration than today's defaults and fit a 64 GB die; LEAN=0 and SP > 1 give
today's defaults back; the cost model resolves --rollout_weights auto / --update_timesteps_per_forward
all as the trainer does (training/lean.resolve)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from fastvideo.tools import launcher_cost

A3 = "scripts/finetune/finetune_flux_grpo_a3_16die.sh"
LEAN = ["--fsdp_param_dtype", "bf16", "--rollout_weights", "auto", "--update_timesteps_per_forward", "all"]
# The multi-device launchers that run the lean options (the multi-node finetune_flux_grpo.sh keeps
# upstream's defaults; the SP launchers too: not tested together).
LEAN_LAUNCHERS = ["finetune_flux_grpo_a3_16die.sh", "finetune_flux_grpo_8gpus.sh", "finetune_flux_grpo_8gpus_lora.sh",
                  "finetune_flux_grpo_a3_16die_lora.sh", "finetune_flux_mixgrpo_8gpus.sh",
                  "finetune_flux_mixgrpo_a3_16die.sh", "finetune_flux_nft_8gpus.sh", "finetune_flux_nft_a3_16die.sh",
                  "finetune_sd3_grpo_8gpus.sh", "finetune_sd3_grpo_a3_16die.sh", "finetune_sd3_nft_8gpus.sh",
                  "finetune_sd3_nft_a3_16die.sh", "finetune_zimage_grpo_8gpus.sh", "finetune_flux2_klein_grpo_a3_16die.sh"] + [
                      f"finetune_flux_{o}_{n}.sh" for o in ("awm", "dgpo", "flash_grpo", "grpo_guard")
                      for n in ("8gpus", "a3_16die")]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LEAN", "SP", "EXTRA_ARGS", "NPROC", "REWARDS")}
    return dict(env, FASTVIDEO_DEVICE="cpu", PYTHON=sys.executable, **extra)


def _lean_flags(flags: list[str]) -> list[str]:
    return [w for i, w in enumerate(flags) if w in LEAN[::2] or (i and flags[i - 1] in LEAN[::2])]


def test_a3_launcher_moves_10x_fewer_bytes_and_fits_64gb():
    r = launcher_cost.price(A3, device_memory_gb=64.0, device="npu", env=_env())
    assert r["ranks"] == 16 and r["gather_dtype"] == "bf16"
    # auto chose the gathered rollout and all 9 trained timesteps (16 steps, fraction 0.6) per forward
    assert r["lean"] == {"rollout_gathered": True, "timesteps_per_forward": 9, "notes": r["lean"]["notes"]}
    assert r["ratio"] >= 10, r
    assert r["verdict"].startswith("fits in 64 GB"), r["verdict"]
    assert r["peak_bytes"] <= 0.9 * 64e9  # within the share auto allows (lean.HEADROOM)
    # the reference traffic, as the cost model prints it (GB per rank per iteration)
    assert r["default_bytes"] / 1e9 == pytest.approx(16565.0, abs=1.0)
    assert r["chosen_bytes"] / 1e9 == pytest.approx(1092.0, abs=1.0)


@pytest.mark.parametrize("launcher", LEAN_LAUNCHERS)
def test_launchers_pass_the_lean_flags(launcher):
    _, flags = launcher_cost.launcher_args(f"scripts/finetune/{launcher}", _env(LINE="current") if
                                           ("zimage" in launcher or "klein" in launcher) else _env())
    assert _lean_flags(flags) == LEAN, launcher
    assert "--mixed_precision" in flags and flags[flags.index("--mixed_precision") + 1] == "bf16"  # bf16 gathers need it


@pytest.mark.parametrize("env", [{"LEAN": "0"}, {"SP": "2"}])
def test_lean_0_and_sp_keep_the_defaults(env):
    _, flags = launcher_cost.launcher_args(A3, _env(**env))
    assert _lean_flags(flags) == []
    _, flags = launcher_cost.launcher_args(A3, _env(EXTRA_ARGS="--rollout_weights sharded"))
    assert flags[-2:] == ["--rollout_weights", "sharded"]  # EXTRA_ARGS comes last: it overrides
    # bf16 gathers need bf16 autocast: a run with --mixed_precision no keeps fp32 gathers
    _, flags = launcher_cost.launcher_args(A3, _env(EXTRA_ARGS="--mixed_precision no"))
    assert _lean_flags(flags) == LEAN[2:]
    # DDP has no FSDP gathers (the trainer refuses --fsdp_param_dtype with it): fp32, the rest kept
    for ddp in ("--fsdp_sharding_strategy none", "--fsdp_sharding_startegy=none"):
        _, flags = launcher_cost.launcher_args(A3, _env(EXTRA_ARGS=ddp))
        assert _lean_flags(flags) == LEAN[2:], ddp


def _tiny(*extra) -> dict:
    from contextlib import redirect_stdout
    from io import StringIO

    from fastvideo.tools.cost_model import main

    buf = StringIO()
    with redirect_stdout(buf):
        main(["--memory", "--json", "--model", "tiny", "--h", "64", "--w", "64", "--sampling_steps", "8",
              "--num_generations", "4", "--world_size", "2", "--device", "cpu", "--rewards", "compressibility:1",
              "--timestep_fraction", "1.0", *extra])
    return json.loads(buf.getvalue())


def test_cost_model_resolves_auto_and_all_like_the_trainer():
    gathered = _tiny("--rollout_weights", "gathered")
    # a device whose usable share (lean.HEADROOM) is below the gathered run's peak: auto keeps the
    # rollout sharded and says so; above it: gathered, with fewer rollout bytes
    low = _tiny("--rollout_weights", "auto", "--device_memory_gb", str(0.5 * gathered["peak_bytes"] / 1e9))
    assert low["lean"]["rollout_gathered"] is False and "auto: sharded" in low["lean"]["notes"][0]
    high = _tiny("--rollout_weights", "auto", "--device_memory_gb", str(gathered["peak_bytes"] * 1.01 / 0.9 / 1e9))
    assert high["lean"]["rollout_gathered"] is True and "auto: gathered" in high["lean"]["notes"][0]
    assert high["fsdp_traffic_chosen_bytes"]["rollout_gather"] < low["fsdp_traffic_chosen_bytes"]["rollout_gather"]
    # all: the 7 trained steps where they fit; halved (7 -> 3 -> 1) where only one timestep's fit
    one, full = _tiny(), _tiny("--update_timesteps_per_forward", "all", "--device_memory_gb", "1000")
    assert full["lean"]["timesteps_per_forward"] == 7 and full["peak_bytes"] > one["peak_bytes"]
    tight = _tiny("--update_timesteps_per_forward", "all", "--device_memory_gb", str(one["peak_bytes"] * 1.001 / 0.9 / 1e9))
    assert tight["lean"]["timesteps_per_forward"] < 7 and "trying 3" in tight["lean"]["notes"][0]
    assert tight["peak_bytes"] <= one["peak_bytes"] * 1.001
