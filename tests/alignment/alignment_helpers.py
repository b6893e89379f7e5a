"""Build recorded runs for the alignment tests with the real RunRecorder (no trainer needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from fastvideo.alignment.recorder import RunRecorder
from fastvideo.models.base import LatentLayout, TensorConditioning
from fastvideo.devices import DistInfo
from fastvideo.sampling.rollout import Trajectory

G = 2  # generations per prompt
STEPS = 3
TOKENS, CHANNELS = 4, 8
SIDE = 32  # image side in pixels


@dataclass
class Rewards:  # the shape of trainer.RewardResult
    total: torch.Tensor
    per_reward: dict


def make_cfg(record_dir, record_tensors: bool = False, seed: int = 42, extra=()):
    from fastvideo.config import parse_config

    argv = ["--data_json_path", "unused.json", "--pretrained_model_name_or_path", "unused",
            "--rewards", "compressibility:1.0", "--record_dir", str(record_dir), "--seed", str(seed)]
    if record_tensors:
        argv.append("--record_tensors")
    return parse_config(argv + list(extra))


def dist_info(rank: int = 0, world_size: int = 1) -> DistInfo:
    return DistInfo(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"))


def caption(group_id: int) -> str:
    return f"prompt number {group_id}"


def sample_image(iteration: int, sample_id: int) -> torch.Tensor:
    """[3, SIDE, SIDE] in [0, 1], a deterministic function of (iteration, sample id)."""
    g = torch.Generator().manual_seed(1000 * iteration + sample_id)
    return torch.rand(3, SIDE, SIDE, generator=g)


def make_traj(iteration: int, sample_ids: list[int], image_fn=sample_image) -> Trajectory:
    ids = torch.tensor(sample_ids, dtype=torch.long)
    g = torch.Generator().manual_seed(iteration)
    b = len(sample_ids)
    latents = torch.randn(b, STEPS + 1, TOKENS, CHANNELS, generator=g)
    return Trajectory(
        latents=latents, log_probs=torch.randn(b, STEPS, generator=g), sigmas=torch.linspace(1, 0, STEPS + 1),
        x0=latents[:, -1],
        images=torch.stack([image_fn(iteration, s) for s in sample_ids]),
        cond=TensorConditioning({"prompt_embeds": torch.zeros(b, 2, 4), "pooled": torch.zeros(b, 4)},
                                {"text_ids": torch.zeros(2, 3)}),
        layout=LatentLayout(height=0, width=0, tokens=(TOKENS, CHANNELS), latent_hw=(0, 0),
                            extras={"image_ids": torch.zeros(TOKENS, 3)}),
        sample_ids=ids, group_ids=ids // G,
        captions=[caption(int(s) // G) for s in sample_ids],
    )


def base_reward(iteration: int, sample_id: int) -> float:
    return 1.0 + 0.1 * sample_id + 0.01 * iteration


def record_run(
    root: Path,
    iterations: int = 3,
    num_samples: int = 4,
    world_size: int = 1,
    reward_factor: Callable[[int], float] = lambda it: 1.0,
    loss_fn: Callable[[int], float] = lambda it: 0.5 / it,
    image_fn=sample_image,
    record_tensors: bool = False,
    first_sample: Callable[[int], int] = lambda it: 8 * it,
) -> Path:
    """A run of ``iterations`` iterations with ``num_samples`` samples each, split over
    ``world_size`` ranks (one recorder per rank, as the trainer has)."""
    root = Path(root)
    cfg = make_cfg(root, record_tensors=record_tensors)
    recorders = [RunRecorder(cfg, dist_info(r, world_size)) for r in range(world_size)]
    per_rank = num_samples // world_size
    for it in range(1, iterations + 1):
        ids = list(range(first_sample(it), first_sample(it) + num_samples))
        for rank, rec in enumerate(recorders):
            mine = ids[rank * per_rank:(rank + 1) * per_rank]
            traj = make_traj(it, mine, image_fn)
            total = torch.tensor([base_reward(it, s) * reward_factor(it) for s in mine])
            rewards = Rewards(total=total, per_reward={"compressibility": total.clone()})
            record = {"iteration": it, "loss": loss_fn(it), "reward_mean": float(total.mean()), "grad_norm": 1.0}
            rec.record_iteration(it, traj, rewards, torch.linspace(-1, 1, len(mine)), record)
    return root
