"""A served clip reward on a 2-rank tiny Wan run (current line, 5-frame clips): the reward server
gets whole clips (rewards/clip_wire.py), one clip it fails on is reported per clip, comes back NaN,
is dropped from its group (advantage 0, the group's statistics over the survivors, never scored 0
or -1 as DanceGRPO's reward code does), counted in metrics.jsonl, and the run trains on (issue #48
item 5)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from current_line_helpers import line_reason
from dist_utils import run_distributed
from fastvideo.rewards.video import ClipReward
from helpers import read_metrics
from server_utils import serve_in_thread

pytestmark = pytest.mark.skipif(line_reason("Wan training") is not None, reason=line_reason("Wan training") or "")
FRAMES, G = 5, 3


class FailsOneClip(ClipReward):
    """Each clip's mean brightness; the reward fails on one clip of the run: clip 1 of the first
    request of more than one clip, every time it is asked to score it."""

    name = "brightness"

    def __init__(self):
        super().__init__()
        self.poison, self.lock, self.shapes = None, threading.Lock(), []

    def _score_clips(self, clips, prompts):
        with self.lock:
            self.shapes.append(tuple(clips.shape))
            if self.poison is None and clips.shape[0] > 1:
                self.poison = clips[1].clone()
        if any(torch.equal(c, self.poison) for c in clips):
            raise RuntimeError("cannot decode this clip")
        return clips.mean(dim=(1, 2, 3, 4))


def _train_recording_advantages(info, argv):
    from fastvideo.config import parse_config
    from fastvideo.train_grpo_flux import build_trainer

    trainer = build_trainer(parse_config(argv), info)
    seen, compute = [], trainer.compute_advantages

    def recording(rewards):
        adv = compute(rewards)
        seen.append((rewards.total.clone(), {k: v.clone() for k, v in rewards.per_reward.items()}, adv.clone()))
        return adv

    trainer.compute_advantages = recording
    records = trainer.train()
    keep = ("rewards/nonfinite_dropped", "optimizer_steps", "skipped_steps", "loss", "grad_norm", "reward_mean")
    return [{k: r.get(k) for k in keep} for r in records], seen


@pytest.mark.slow
def test_a_failing_clip_of_a_served_clip_reward_is_dropped_and_counted(tiny_wan_dir, wan_embeddings, tmp_path):
    from fastvideo.tools.reward_server import build_app

    reward, out = FailsOneClip(), tmp_path / "run"
    with serve_in_thread(build_app({"brightness": reward})) as (url, _):
        argv = ["--seed", "42", "--model_family", "wan", "--num_frames", str(FRAMES),
                "--pretrained_model_name_or_path", str(tiny_wan_dir), "--data_json_path", str(wan_embeddings),
                "--output_dir", str(out), "--rewards", f"remote:{url}/brightness:1.0", "--reward_batch_size", str(G),
                "--h", "32", "--w", "32", "--sampling_steps", "3", "--eta", "0.7", "--shift", "3",
                "--num_generations", str(G), "--train_batch_size", "1", "--rollout_batch_size", str(G),
                "--train_micro_batch_size", str(G), "--use_group", "--mixed_precision", "no", "--max_train_steps", "2",
                "--checkpointing_steps", "100", "--dataloader_num_workers", "0", "--learning_rate", "1e-2",
                "--guidance_scale", "5.0", "--no_quantize_timestep", "--save_images_every", "0",
                "--flow_grpo_sampling", "--timestep_fraction", "1.0", "--fsdp_sharding_strategy", "none"]
        ranks = run_distributed(_train_recording_advantages, argv, timeout=600)
    assert reward.poison is not None and all(s[1:] == (FRAMES, 3, 32, 32) for s in reward.shapes)  # whole clips
    rows = ranks[0][0]
    assert [r["rewards/nonfinite_dropped"] for r in rows] == [1, 0]  # the run's one failed clip, counted once
    assert all(r["optimizer_steps"] >= 1 and r["skipped_steps"] == 0 for r in rows)
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 and math.isfinite(r["reward_mean"]) for r in rows)
    logged = read_metrics(out)
    assert [r["rewards/nonfinite_dropped"] for r in logged] == [1, 0] and logged[0]["rewards/nonfinite/brightness"] == 1
    dropped = [(total, raw, adv) for _, seen in ranks for total, raw, adv in seen[:1] if torch.isnan(total).any()]
    assert len(dropped) == 1  # one rank's first iteration
    total, raw, adv = dropped[0]
    bad = torch.isnan(total).nonzero().flatten().tolist()
    assert len(bad) == 1 and all(torch.isnan(v[bad[0]]) for v in raw.values())  # NaN: not 0, not -1
    keep = [i for i in range(G) if i != bad[0]]
    assert adv[bad[0]] == 0  # no policy term for the dropped clip
    kept = total[keep]
    torch.testing.assert_close(adv[keep], ((kept - kept.mean()) / (kept.std() + 1e-8)).clamp(-5, 5))  # survivors only
    clean = [seen[0] for _, seen in ranks if not torch.isnan(seen[0][0]).any()][0]
    t = clean[0]
    torch.testing.assert_close(clean[2], ((t - t.mean()) / (t.std() + 1e-8)).clamp(-5, 5))
