"""Record a training run so that two runs (GPU vs NPU, one world size vs another) can be compared.

Layout under ``--record_dir`` (every file is written atomically: write, then rename)::

    manifest.json                         rank 0, at start: config, device, world size, versions, commit
    probes/probes.{json,safetensors}      --probe_layers (fastvideo.alignment.probes)
    iter_000001/
        metrics.json                      rank 0: the iteration's metrics record (loss, ratios, grad norm...)
        samples_rank00000.json            each rank: its samples (global id, group id, caption, reward
                                          total and per reward, advantage)
        images/sample_000012.png          each rank: its images, named by GLOBAL sample id (a video
                                          family's clips: animated PNGs, lossless, frame 0 first)
        tensors_rank00000.safetensors     --record_tensors: initial_noise/{id} [L, C] for each sample,
                                          latents/{id} [N+1, L, C] and log_probs/{id} [N] for the
                                          rank's first sample (a rollout that kept no latents,
                                          --algorithm nft: x0/{id} [L, C] for each sample instead)

Names depend only on global sample ids, never on the rank or the position in a batch, so runs
with different world sizes or rollout batch sizes compare file by file.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.training.hooks import TrainerHook
from fastvideo.utils import atomic_write_bytes, atomic_write_json

FORMAT = "flux_grpo-run-record"
MANIFEST = "manifest.json"
METRICS = "metrics.json"
IMAGES = "images"


def iteration_dir(root: str | Path, iteration: int) -> Path:
    return Path(root) / f"iter_{int(iteration):06d}"


def image_name(sample_id: int) -> str:
    return f"sample_{int(sample_id):06d}.png"


def samples_name(rank: int) -> str:
    return f"samples_rank{int(rank):05d}.json"


def tensors_name(rank: int) -> str:
    return f"tensors_rank{int(rank):05d}.safetensors"


def _png_bytes(pixels) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _sample_pngs(samples: torch.Tensor):
    """PNG bytes of each sample: an image's; a clip's (frames [F, 3, H, W], F > 1) as an animated
    PNG, lossless, so that run comparisons stay exact (compare.py reads frame 0)."""
    from fastvideo.sampling.images import as_images_or_clips, to_uint8

    samples, is_clip = as_images_or_clips(samples)
    if is_clip:
        from fastvideo.video_io import apng_bytes

        return [apng_bytes(clip) for clip in samples.detach().float().clamp(0, 1).cpu()]
    return [_png_bytes(pixels) for pixels in to_uint8(samples).numpy()]


def git_commit(path: str | Path | None = None) -> str | None:
    """HEAD of the git checkout holding ``path`` (default: this package), or None."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: the manifest just says unknown
        return None


def build_manifest(cfg, info: devices.DistInfo) -> dict:
    """Everything needed to tell two recorded runs apart (JSON-serialisable)."""
    import platform as pyplatform

    return {
        "format": FORMAT,
        "version": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # default=str: paths and other odd config values become strings instead of failing.
        "config": json.loads(json.dumps(cfg.to_dict(), default=str)),
        "device": {"type": info.device.type, "name": devices.device_name(info.device)},
        "world_size": info.world_size,
        "seed": cfg.optim.seed,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "diffusers": _version("diffusers"),
            "transformers": _version("transformers"),
        },
        "host": pyplatform.node(),
        "git_commit": git_commit(),
    }


def sample_records(sample_ids, group_ids, captions, total, per_reward: dict, advantages) -> list[dict]:
    """One dict per sample: {sample_id, group_id, caption, reward, rewards: {name: raw}, advantage}.
    All per-sample inputs are [B] (tensors or lists)."""
    def floats(x):
        return [float(v) for v in torch.as_tensor(x).detach().float().cpu().reshape(-1).tolist()]

    ids = [int(i) for i in torch.as_tensor(sample_ids).reshape(-1).tolist()]
    groups = [int(i) for i in torch.as_tensor(group_ids).reshape(-1).tolist()]
    tot, adv = floats(total), floats(advantages)
    per = {name: floats(v) for name, v in per_reward.items()}
    n = len(ids)
    lengths = {"group_ids": len(groups), "captions": len(captions), "rewards": len(tot), "advantages": len(adv),
               **{f"reward {k}": len(v) for k, v in per.items()}}
    bad = {k: v for k, v in lengths.items() if v != n}
    if bad:
        raise ValueError(f"{n} sample ids but per-sample lengths {bad}")
    return [
        {"sample_id": ids[i], "group_id": groups[i], "caption": captions[i], "reward": tot[i],
         "rewards": {k: v[i] for k, v in per.items()}, "advantage": adv[i]}
        for i in range(n)
    ]


class RunRecorder(TrainerHook):
    """Writes a run record under ``cfg.output.record_dir`` (layout in the module docstring); as a
    trainer hook, one iteration after each iteration's metrics."""

    def __init__(self, cfg, info: devices.DistInfo):
        if not cfg.output.record_dir:
            raise ValueError("RunRecorder needs cfg.output.record_dir (--record_dir)")
        self.cfg = cfg
        self.info = info
        self.root = Path(cfg.output.record_dir)
        self.rank = info.rank  # the data-parallel rank its files are named by (set per iteration)
        self.record_tensors = bool(cfg.output.record_tensors)
        self.root.mkdir(parents=True, exist_ok=True)
        if info.is_main:
            atomic_write_json(self.root / MANIFEST, build_manifest(cfg, info), indent=1)

    def on_iteration_end(self, trainer, result) -> None:
        dims = getattr(trainer, "dims", None)
        if dims is not None:
            if dims.sp_rank:  # a sequence group's ranks hold the same samples: its first rank records them
                return
            self.rank = dims.dp_rank
        self.record_iteration(result.iteration, result.traj, result.rewards, result.advantages, result.record)

    def record_iteration(self, iteration: int, traj, rewards, advantages: torch.Tensor, record: dict) -> Path:
        """Write iteration ``iteration``'s samples, images (and tensors) of this rank; rank 0 also
        its metrics. ``traj``: a rollout Trajectory; ``rewards``: total [B] + per_reward dict;
        ``advantages`` [B]. Returns the iteration folder."""
        folder = iteration_dir(self.root, iteration)
        samples = sample_records(traj.sample_ids, traj.group_ids, traj.captions, rewards.total,
                                 rewards.per_reward, advantages)
        atomic_write_json(folder / samples_name(self.rank), {"iteration": int(iteration), "samples": samples},
                          indent=1)
        for row, png in zip(samples, _sample_pngs(traj.images)):
            atomic_write_bytes(folder / IMAGES / image_name(row["sample_id"]), png)
        if self.record_tensors:
            self._write_tensors(folder, traj)
        if self.info.is_main:
            atomic_write_json(folder / METRICS, _jsonable(record), indent=1)
        return folder

    def _write_tensors(self, folder: Path, traj) -> None:
        from safetensors.torch import save

        ids = [int(i) for i in traj.sample_ids.reshape(-1).tolist()]
        def own(t: torch.Tensor) -> torch.Tensor:
            # clone: safetensors refuses tensors that share storage (noise is a view of latents)
            return t.detach().float().cpu().clone().contiguous()

        if traj.latents is None:  # a rollout that kept only the clean samples (Objective.needs_trajectory)
            out = {f"x0/{sid}": own(traj.x0[i]) for i, sid in enumerate(ids)}
        else:
            out = {f"initial_noise/{sid}": own(traj.latents[i, 0]) for i, sid in enumerate(ids)}
            # The whole chain of one sample per rank: enough to see at which step two runs part.
            out[f"latents/{ids[0]}"] = own(traj.latents[0])
        if traj.log_probs is not None:  # none kept for an objective that reads none (Objective.needs_log_probs)
            out[f"log_probs/{ids[0]}"] = own(traj.log_probs[0])
        atomic_write_bytes(folder / tensors_name(self.rank), save(out))


def _jsonable(record: dict) -> dict:
    """Metrics with tensors turned into numbers (json.dumps writes NaN/inf as-is, which Python reads)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, torch.Tensor):
            v = v.item() if v.numel() == 1 else v.tolist()
        out[k] = v
    return out
