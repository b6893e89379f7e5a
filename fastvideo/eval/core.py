"""Sample the evaluation images with fixed noise and score them, spread over ranks.

Items are (prompt p, image k) pairs in prompt-major order. They are cut into a fixed grid of
batches (batch j holds items j*B .. j*B+B-1) dealt round-robin to ranks, so every image is
computed in the same batch, with the same noise (RandomSource.eval_noise, keyed on the prompt's
text and k), whatever the world size: scores are the same at 1 and 2 ranks (up to BLAS rounding on FSDP's
flat-parameter buffers, an ulp or so). Every rank runs the
same number of batches (a spare rank repeats batch 0 and drops it) because an FSDP forward is a
collective. Under sequence parallelism the ranks of a sequence group sample the same batches (the
transformer's forward is theirs together); the group's first rank alone decodes and scores them
and broadcasts the scores over the group.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Mapping

import torch

from fastvideo import devices
from fastvideo.eval.prompts import EvalPrompts
from fastvideo.sampling.plan import SamplingPlan, full_sde_plan, on_grid, ode_plan
from fastvideo.sampling.randomness import RandomSource
from fastvideo.sampling.rollout import sample_transitions


@dataclass(frozen=True)
class SampleSettings:
    height: int
    width: int
    steps: int
    eta: float  # 0: deterministic ODE (Euler) sampling
    shift: float
    batch_size: int  # images per transformer call
    num_images_per_prompt: int  # K
    sigma_grid: str = "shifted_linspace"  # --sigma_grid (sampling.sde.grid_sigmas)
    terminal: float | None = None  # the family's scheduler's shift_terminal (ModelFamily.schedule_terminal)


@dataclass
class EvalResult:
    """scores: reward name -> [P, K] float64 (identical on every rank); grid: [G, 3, H, W] float32
    in [0, 1] (a video family's clips: [G, F, 3, H, W]), image 0 of the first G prompts (identical
    on every rank that decodes: sp rank 0; zeros [G, 3, H, W] on a sequence group's other ranks);
    seconds: wall time of the evaluation."""

    captions: list[str]
    scores: dict[str, torch.Tensor]
    grid: torch.Tensor
    seconds: float

    def summary(self) -> dict[str, dict]:
        """name -> {mean, std (over all P*K images, population), per_prompt (mean over k)}."""
        out = {}
        for name, s in self.scores.items():
            out[name] = {"mean": s.mean().item(), "std": s.std(unbiased=False).item(),
                         "per_prompt": [round(v, 6) for v in s.mean(dim=1).tolist()]}
        return out


def batch_grid(num_items: int, batch_size: int) -> list[list[int]]:
    """Fixed batches of item indices: [[0..B-1], [B..2B-1], ...] (the last may be shorter)."""
    return [list(range(s, min(num_items, s + batch_size))) for s in range(0, num_items, batch_size)]


def eval_plan(s: SampleSettings) -> SamplingPlan:
    """Euler ODE on every transition (eta = 0), else DanceGRPO's SDE on every one, on the run's grid."""
    plan = ode_plan(s.steps, s.shift) if s.eta <= 0 else full_sde_plan(s.steps, s.shift, s.steps, 1)
    return on_grid(plan, s.sigma_grid, s.steps, s.shift, s.terminal)


@torch.no_grad()
def sample_images(model, vae, prompts: EvalPrompts, items: list[tuple[int, int]], randomness: RandomSource,
                  s: SampleSettings, device, autocast_dtype=None, *, family, decode: bool = True):
    """Images [b, 3, H, W] float32 in [0, 1] for items (prompt index, image index), sampled by the
    rollout's loop (sampling.rollout.sample_transitions) on eval_plan(s). family: the model's
    ModelFamily, built with the evaluation's forward settings. decode False: sampled, not decoded
    (None; a sequence group's other ranks)."""
    device = torch.device(device)
    layout = family.layout(s.height, s.width, vae, model, device)
    shape = layout.tokens
    caps = [prompts.captions[p] for p, _ in items]
    rows = torch.tensor([p for p, _ in items])
    x = torch.stack([randomness.eval_noise(c, k, shape) for c, (_, k) in zip(caps, items)]).to(device)
    cond = prompts.cond.select(rows).to(device)
    plan = eval_plan(s)
    sigmas = plan.sigmas.to(device)
    step_eps = {}
    if s.eta > 0:
        step_eps = {step: torch.stack([randomness.eval_noise(c, k, shape, step=step)
                                       for c, (_, k) in zip(caps, items)]).to(device) for step in range(s.steps)}
    amp = devices.autocast(device, autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    with amp:
        _, _, x0 = sample_transitions(family, model, x, step_eps, plan, sigmas, cond, layout, s.eta)
        if not decode:
            return None
        return family.decode(vae, x0, layout).float().clamp(0, 1)


def _all_gather_stack(t: torch.Tensor, device, dims) -> torch.Tensor:
    """[...] on every data-parallel rank -> [W, ...] (dp-rank order); [1, ...] on one process."""
    if dims.dp_size == 1:
        return t.unsqueeze(0)
    return dims.gather_dp(t.to(device).unsqueeze(0)).cpu()


def _share_in_sequence_group(local: torch.Tensor, device, dims) -> torch.Tensor:
    """sp rank 0's scores [rounds, B, R] float64 on every rank of its sequence group (one broadcast;
    float64 as scored: HCCL broadcasts every dtype); unchanged at sp = 1."""
    if dims.sp == 1:
        return local
    import torch.distributed as dist

    buf = local.to(device).contiguous()
    dist.broadcast(buf, src=dims.rank - dims.sp_rank, group=dims.sp_group)
    return buf.cpu()


def score_images(rewards: Mapping[str, object], images: torch.Tensor, captions: list[str],
                 sources: torch.Tensor | None = None) -> torch.Tensor:
    """[b, R] float64: each reward (in mapping order) on each image; sources (editing: the images'
    source images) go to the rewards that take them (rewards.base.takes_sources); clips [b, F, 3, H, W]
    (a video family's) are scored as training scores them with --video_reward_frames all (rewards.video)."""
    from fastvideo.rewards.frames import FrameSelection
    from fastvideo.rewards.video import score

    return torch.stack([score(rewards[n], images, captions, FrameSelection(), sources).double().cpu()
                        for n in rewards], dim=1)


def evaluate(model, vae, prompts: EvalPrompts, rewards: Mapping[str, object], randomness: RandomSource,
             s: SampleSettings, device, autocast_dtype=None, grid_prompts: int = 8, progress: bool = False,
             *, family, dims=None) -> EvalResult:
    """Collective: every rank calls it with the same arguments; all get the same EvalResult. The
    batches are shared out over the data-parallel ranks of ``dims`` (default: the whole world)."""
    from fastvideo.distributed.parallel import ParallelDims

    t0 = time.perf_counter()
    dims = dims if dims is not None else ParallelDims.build(devices.world_size(), devices.rank())
    world, rank = dims.dp_size, dims.dp_rank
    scores_here = dims.sp_rank == 0  # a sequence group's samples are decoded and scored once
    K, P, B = s.num_images_per_prompt, len(prompts), s.batch_size
    items = [(p, k) for p in range(P) for k in range(K)]
    batches = batch_grid(len(items), B)
    rounds = math.ceil(len(batches) / world)
    g = min(grid_prompts, P)
    local = torch.full((rounds, B, len(rewards)), float("nan"), dtype=torch.float64)
    grid = None  # shaped as a decoded sample once the first batch is decoded (a clip: [g, F, 3, H, W])
    from fastvideo.progress import Progress

    bar = Progress(rounds, "eval", unit="round", enabled=progress and rank == 0)
    for r in range(rounds):
        j = r * world + rank
        chosen = batches[j] if j < len(batches) else batches[0]  # a spare round keeps FSDP in step
        batch_items = [items[i] for i in chosen]
        images = sample_images(model, vae, prompts, batch_items, randomness, s, device, autocast_dtype, family=family,
                               decode=scores_here)
        if scores_here and grid is None:  # every decoding rank decodes round 0 (a spare one batch 0)
            grid = torch.zeros(g, *images.shape[1:])
        if j < len(batches) and scores_here:
            sources = family.source_images(prompts.cond.select(torch.tensor([p for p, _ in batch_items])))
            local[r, :len(chosen)] = score_images(rewards, images, [prompts.captions[p] for p, _ in batch_items],
                                                  sources)
            for row, (p, k) in enumerate(batch_items):
                if k == 0 and p < g:
                    grid[p] = images[row].cpu()
        bar.update(1)
    bar.close()
    local = _share_in_sequence_group(local, device, dims)
    gathered = _all_gather_stack(local, device, dims)  # [W, rounds, B, R]
    flat = torch.cat([gathered[j % world, j // world, :len(b)] for j, b in enumerate(batches)])  # [P*K, R]
    if grid is None:  # a sequence group's other ranks decode nothing (their data-parallel group neither)
        grid = torch.zeros(g, 3, s.height, s.width)
    if world > 1:
        grid = grid.to(device)
        dims.all_reduce_sum(grid)  # each grid image was filled on exactly one rank
        grid = grid.cpu()
    scores = {n: flat[:, i].reshape(P, K) for i, n in enumerate(rewards)}
    return EvalResult(list(prompts.captions), scores, grid, time.perf_counter() - t0)
