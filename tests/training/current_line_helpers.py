"""What the current-line families' training tests share (FLUX.2 [klein] and [dev], Z-Image, Qwen-Image): the line check,
the launchers' command lines and the tiny runs' overrides of them."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line
from helpers import ROOT

# launcher -> (world size, prompts per rank, accumulation)
LAUNCHERS = {"scripts/finetune/finetune_flux2_klein_grpo_8gpus.sh": (8, 6, 12),
             "scripts/finetune/finetune_flux2_klein_grpo_a3_16die.sh": (16, 3, 6)}
DEV_LAUNCHERS = {"scripts/finetune/finetune_flux2_dev_grpo_8gpus.sh": (8, 6, 48),
                 "scripts/finetune/finetune_flux2_dev_grpo_a3_16die.sh": (16, 3, 24)}
ZIMAGE_LAUNCHERS = {"scripts/finetune/finetune_zimage_grpo_8gpus.sh": (8, 6, 12),
                    "scripts/finetune/finetune_zimage_grpo_a3_16die.sh": (16, 3, 6)}
QWEN_IMAGE_LAUNCHERS = {"scripts/finetune/finetune_qwen_image_grpo_8gpus.sh": (8, 6, 24),
                        "scripts/finetune/finetune_qwen_image_grpo_a3_16die.sh": (16, 3, 12)}
WAN_LAUNCHERS = {"scripts/finetune/finetune_wan21_grpo_8gpus.sh": (8, 2, 24),
                 "scripts/finetune/finetune_wan21_grpo_a3_16die.sh": (16, 1, 12),
                 "scripts/finetune/finetune_wan22_grpo_8gpus.sh": (8, 8, 4),
                 "scripts/finetune/finetune_wan22_grpo_a3_16die.sh": (16, 4, 2)}
WAN_A14B_LAUNCHERS = {"scripts/finetune/finetune_wan22_a14b_grpo_8gpus.sh": (8, 6, 48),
                      "scripts/finetune/finetune_wan22_a14b_grpo_a3_16die.sh": (16, 3, 24)}
WAN_I2V_LAUNCHERS = {"scripts/finetune/finetune_wan_i2v_14b_grpo_8gpus.sh": (8, 6, 48),
                     "scripts/finetune/finetune_wan_i2v_14b_grpo_a3_16die.sh": (16, 3, 24),
                     "scripts/finetune/finetune_wan_i2v_a14b_grpo_8gpus.sh": (8, 6, 48),
                     "scripts/finetune/finetune_wan_i2v_a14b_grpo_a3_16die.sh": (16, 3, 24)}
SEQ = 48  # the tiny embeddings' Qwen3 length (conftest's flux2_embeddings, zimage_embeddings)
WEIGHTS = "diffusion_pytorch_model.safetensors"


def line_reason(what: str = "FLUX.2 [klein] training") -> str | None:
    """None on the current library line, else why ``what`` cannot run here (the skip reason)."""
    try:
        require_line(CURRENT, what)
    except LibraryLineError as exc:
        return str(exc)
    return None


def i2v_training_marks() -> list:
    """The Wan image-to-video training modules' pytestmark: the current line, and forked ranks only (their
    recording reward is registered in the test process)."""
    import pytest

    reason = line_reason("Wan image-to-video training")
    return [pytest.mark.skipif(reason is not None, reason=reason or ""),
            pytest.mark.skipif(os.environ.get("FLUX_GRPO_TEST_REAL_TORCHRUN", "0") == "1",
                               reason="the recording reward is registered in the test process; forked ranks only")]


def launcher_argv(script: str, **env_extra) -> list[str]:
    """The training flags a launcher's DRY_RUN=1 command line passes (env_extra: KLEIN=... and the like)."""
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root"), **env_extra}
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "line: current" in out.stdout  # the dry run names the library line it would run on
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    world = {**LAUNCHERS, **DEV_LAUNCHERS, **ZIMAGE_LAUNCHERS, **QWEN_IMAGE_LAUNCHERS, **WAN_LAUNCHERS,
             **WAN_A14B_LAUNCHERS, **WAN_I2V_LAUNCHERS}[script][0]
    assert f"--nproc_per_node={world}" in words
    return words[words.index("fastvideo/train_grpo_flux.py") + 1:]


def tiny_argv(model, index, out, script="scripts/finetune/finetune_flux2_klein_grpo_8gpus.sh", **more) -> list[str]:
    """The 8-GPU launcher's flags (FLUX.2's unless ``script``), then the tiny run's overrides
    (argparse keeps the last value)."""
    tiny = dict(pretrained_model_name_or_path=model, data_json_path=index, output_dir=out, h=32, w=32,
                sampling_steps=4, num_generations=2, train_batch_size=1, rollout_batch_size=2,
                train_micro_batch_size=2, gradient_accumulation_steps=1, rewards="compressibility:1.0",
                max_train_steps=2, checkpointing_steps=1, dataloader_num_workers=0, save_images_every=0,
                learning_rate=1e-3, mixed_precision="no")
    tiny.update(more)
    # LEAN=0: the launcher's lean options need bf16 autocast (scripts/common.sh); KLEIN_TASK=t2i: the tiny
    # runs train klein on prompts alone (its editing task: test_flux2_edit_training.py)
    argv = launcher_argv(script, LEAN="0", KLEIN_TASK="t2i")
    return argv + [w for k, v in tiny.items() for w in (f"--{k}", str(v))]
