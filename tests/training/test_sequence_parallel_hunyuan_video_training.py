"""HunyuanVideo's --sp_size 2 through the trainer on 2 gloo ranks, on both library lines (as
tests/training/test_sequence_parallel_training.py does for FLUX.1): against one rank without sequence
parallelism, 3 GRPO iterations on 5-frame clips of the tiny folder (2 latent frames x 2 x 2 tokens after
the 1x2x2 patches: each rank holds one frame; activation checkpointing on) with the same rollout latents and log-probabilities (the
run record's tensors), the same per-iteration rewards, losses and pre-clip gradient norms and the same
weights after them, to 1e-5 relative; sp = 2's checkpoint-2 resumed on one rank continues as the sp = 2
run does. The start-up size check refuses a clip whose video tokens --sp_size does not divide, and a
head count it does not divide, in one line before any model loads (exit 2)."""

from __future__ import annotations

import json

import pytest

from fastvideo.config import parse_config
from fastvideo.errors import ConfigError
from fastvideo.training.builders import build_family, check_sequence_parallel
from helpers import read_metrics, torchrun, train_args
from test_sequence_parallel_training import WEIGHTS, _check_parity, _flags, _ok, _runs, _same_metrics, _same_tensors

# activation checkpointing on: the blocks' RoPE pre-hook runs again in the recomputation
FAMILY = dict(model_family="hunyuan_video", num_frames=5, guidance_scale=6.0, rewards="compressibility:1.0",
              gradient_checkpointing=True)


@pytest.mark.slow
def test_hunyuan_video_sp2_equals_one_rank_and_resumes_at_sp1(tiny_hunyuan_video_dir, hunyuan_video_embeddings,
                                                              tmp_path):
    def argv_for(out, flags):
        return train_args(hunyuan_video_embeddings, tiny_hunyuan_video_dir, out, **{**flags, **FAMILY})

    one, two = _runs(tmp_path, argv_for)
    _check_parity(tmp_path, one, two)
    resumed = tmp_path / "to_sp1"
    _ok(torchrun(argv_for(resumed, _flags(tmp_path / "rec_to_sp1", resume_from_checkpoint=str(two / "checkpoint-2"))),
                 nproc=1))
    _same_metrics(read_metrics(two), read_metrics(resumed), [3])
    _same_tensors(two / "checkpoint-3" / WEIGHTS, resumed / "checkpoint-3" / WEIGHTS, "resumed weights", adam_steps=1)


def test_hunyuan_video_sp_sizes_refused_in_one_line(tiny_hunyuan_video_dir, hunyuan_video_embeddings, tmp_path):
    """1 frame at 48 x 48: 1 latent frame x 3 x 3 = 9 tokens, refused at sp = 2 (5 frames: 2 x 3 x 3 = 18,
    accepted; the frames count); sp = 4 against the tiny model's 2 heads refused; through torchrun each
    rank refuses with the one line."""
    def cfg(sp, frames, **flags):
        return parse_config(train_args(hunyuan_video_embeddings, tiny_hunyuan_video_dir, tmp_path / "out", sp_size=sp,
                                       **{**FAMILY, "num_frames": frames, **flags}))

    config = json.loads((tiny_hunyuan_video_dir / "transformer" / "config.json").read_text())
    family = build_family(cfg(2, 53))
    assert family.sequence_tokens(480, 480, config) == 14 * 30 * 30  # DanceGRPO's 53 frames at 480 x 480
    with pytest.raises(ConfigError, match="--sp_size 2 does not divide the 9 image tokens") as err:
        check_sequence_parallel(cfg(2, 1, h=48, w=48), build_family(cfg(2, 1)), 2)
    assert "\n" not in str(err.value)
    check_sequence_parallel(cfg(2, 5, h=48, w=48), build_family(cfg(2, 5)), 2)
    with pytest.raises(ConfigError, match="--sp_size 4 does not divide the transformer's 2 attention heads"):
        check_sequence_parallel(cfg(4, 5), build_family(cfg(4, 5)), 4)
    proc = torchrun(train_args(hunyuan_video_embeddings, tiny_hunyuan_video_dir, tmp_path / "run", sp_size=2, h=48,
                               w=48, **{**FAMILY, "num_frames": 1}), nproc=2)
    assert proc.returncode == 1, proc.stderr[-3000:]  # each rank exits 2; torchrun reports a failed worker as 1
    lines = [line for line in proc.stderr.splitlines() if "does not divide the 9 image tokens" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
