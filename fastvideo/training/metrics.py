"""Per-iteration metrics: reduced across ranks, written by rank 0 to metrics.jsonl, plotted as PNG."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.distributed import comm_count
from fastvideo.grpo.advantages import zero_std_ratio
from fastvideo.utils import atomic_write_text, read_jsonl


class PhaseTimer:
    """Wall-clock seconds per named phase. Synchronises the device at phase edges only. The
    collectives inside a phase are counted under its name (fastvideo.distributed.comm_count)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        devices.synchronize(self.device)
        start = time.perf_counter()
        try:
            with comm_count.phase(name):
                yield
        finally:
            devices.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def reset(self) -> None:
        self.seconds = {}


def reduce_scalars(values: dict[str, float | torch.Tensor], device: torch.device, op: str = "mean",
                   dims=None) -> dict[str, float]:
    """Reduce a flat dict of scalars across ranks in one collective (mean or max); with ``dims``
    (distributed.parallel.ParallelDims) across its data-parallel group, else across the world.

    Packed as float32: HCCL's allreduce refuses float64 ("HCCL allreduce: Unsupported data type
    at::kDouble", torch-npu 2.7.1 ProcessGroupHCCL.cpp checkSupportedDataType), and an NPU tensor
    cannot hold float64 anyway. float32 keeps ~7 significant digits, ample for logged metrics.
    """
    if not values:
        return {}
    keys = sorted(values)
    packed = torch.stack([torch.as_tensor(values[k]).to(torch.float32).reshape(()) for k in keys]).to(device)
    reducer = dims if dims is not None else devices
    if op == "mean":
        reducer.all_reduce_mean(packed)
    elif op == "max":
        reducer.all_reduce_max(packed)
    else:
        raise ValueError(op)
    return dict(zip(keys, packed.cpu().tolist()))


def reward_metrics(dims, device, rewards, advantages: torch.Tensor, cfg) -> dict:
    """Reward and advantage statistics over the data-parallel group's samples ("_samples": how many).

    Samples a reward scored non-finite (dropped, rewards/combine.py) are left out of the reward
    statistics and counted: ``rewards/nonfinite_dropped`` (every iteration) and, when some,
    ``rewards/nonfinite/<name>`` per reward."""
    G = cfg.rollout.num_generations
    all_rewards = dims.gather_dp(rewards.total.to(device)).cpu()
    kept = _finite(all_rewards)
    record = {
        "reward_mean": kept.mean().item(),
        "reward_std": kept.std(unbiased=False).item(),
        # One sample per prompt (GRPO without --use_group): the whole gathered batch is the one group.
        "zero_std_ratio": zero_std_ratio(all_rewards, G if G > 1 else all_rewards.numel()).item(),
        "rewards/nonfinite_dropped": all_rewards.numel() - kept.numel(),
    }
    for name, vals in rewards.per_reward.items():
        everything = dims.gather_dp(vals.to(device)).cpu()
        finite = _finite(everything)
        record[f"reward/{name}_mean"] = finite.mean().item()
        record[f"reward/{name}_std"] = finite.std(unbiased=False).item()
        if finite.numel() < everything.numel():
            record[f"rewards/nonfinite/{name}"] = everything.numel() - finite.numel()
    all_adv = dims.gather_dp(advantages.to(device)).cpu()
    record.update(adv_mean=all_adv.mean().item(), adv_std=all_adv.std(unbiased=False).item(),
                  adv_abs_max=all_adv.abs().max().item(), _samples=all_rewards.numel())
    return record


def _finite(values: torch.Tensor) -> torch.Tensor:
    """The finite entries of [N] (the tensor itself when all are: the default path's statistics
    stay bit-identical)."""
    ok = torch.isfinite(values)
    return values if bool(ok.all()) else values[ok]


class MetricsWriter:
    """Append-only metrics.jsonl (rank 0). On resume, lines past the checkpoint are dropped so the
    file describes exactly the run that continues."""

    def __init__(self, output_dir: str | Path, enabled: bool):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.enabled = enabled

    def truncate_after(self, iteration: int) -> None:
        if not self.enabled or not self.path.exists():
            return
        # Tolerates a torn last line (a crash mid-write), saying so; rewritten atomically (a crash
        # now leaves the old file or the new one).
        keep = [r for r in read_jsonl(self.path) if r.get("iteration", 0) <= iteration]
        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))

    def reset(self) -> None:
        if self.enabled and self.path.exists():
            self.path.unlink()

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        except OSError as exc:  # a full disk's write() names no file: name it for the one-line report
            exc.filename = exc.filename or str(self.path)
            raise

    def read(self) -> list[dict]:
        return read_jsonl(self.path)


def plot_reward_curve(records: list[dict], out_png: str | Path, title: str = "GRPO reward") -> Path | None:
    """Reward mean (and each reward) per iteration with a +-std band, saved as PNG."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in records]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    mean = [r["reward_mean"] for r in records]
    std = [r.get("reward_std", 0.0) for r in records]
    axes[0].plot(its, mean, marker="o", ms=3, label="total reward")
    axes[0].fill_between(its, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    for key in sorted(k for k in records[-1] if k.startswith("reward/") and k.endswith("_mean")):
        axes[0].plot(its, [r.get(key, float("nan")) for r in records], ls="--", label=key)
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("reward")
    axes[0].set_title(title)
    axes[0].legend(fontsize=8)
    axes[1].plot(its, [r.get("loss", float("nan")) for r in records], color="tab:red")
    axes[1].set_xlabel("iteration")
    axes[1].set_ylabel("loss")
    axes[1].set_title("policy loss")
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
