"""Decode and score each rollout chunk while the next chunk samples (--reward_overlap).

Without overlap an iteration runs rollout -> decode -> reward one after the other. With overlap
the rollout hands every chunk of rollout_batch_size samples to :meth:`ChunkScorer.on_chunk` as
soon as it is sampled: the chunk is decoded on the main thread (the VAE shares the transformer's
stream) and its raw reward scores are computed on one worker thread -- on an accelerator on a
side stream that first waits for the decode -- while the main thread goes on sampling.
:meth:`ChunkScorer.finish` waits for the last chunk and combines the raw scores of the whole
batch (group normalisation needs whole groups).

It pays when the reward runs where the rollout does not: HPS/PickScore on the CPU
(--reward_device cpu) while a GPU/NPU samples. When both share one CPU they compete for its
cores and the iteration gets slower (0.74x measured, docs/performance.md), so --reward_overlap
auto turns it on only in the first case.

Scores are per sample, so they do not depend on the chunking: compressibility is bit-identical
with and without overlap, model rewards agree to float rounding (a different batch shape can
pick a different GEMM blocking).

Under sequence parallelism (--sp_size > 1) the ranks of a sequence group hold the same samples:
only the group's first rank decodes and scores them (one request per sample to a remote: server,
one model pass), and :func:`share_rewards` broadcasts its scores to the others.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import torch

from fastvideo import devices
from fastvideo.algorithms.base import RewardResult
from fastvideo.rewards.combine import MultiReward
from fastvideo.sampling.rollout import RolloutConfig, decode_images
from fastvideo.training.metrics import PhaseTimer


@dataclass
class ScoredChunks:
    """What the overlapped decode + reward produced for one iteration's batch of B samples.

    images [B, 3, H, W] float32 in [0, 1]; raw: reward name -> [B] float32 (CPU);
    busy_s: seconds the worker spent scoring (hidden behind sampling except for the last chunk).
    """

    images: torch.Tensor
    raw: dict[str, torch.Tensor]
    busy_s: float


class ChunkScorer:
    """One per trainer; :meth:`begin` each iteration, pass :meth:`on_chunk` to ``rollout`` and
    call :meth:`finish` after it.

    The worker thread binds itself to the training device once (the current device is per
    thread on CUDA and NPU) and keeps its own side stream.
    """

    def __init__(self, reward: MultiReward, vae, rollout_cfg: RolloutConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None, timer: PhaseTimer, family):
        self.reward = reward
        self.family = family  # the model family that decodes
        self.vae = vae
        self.rollout_cfg = rollout_cfg
        self.device = torch.device(device)
        self.autocast_dtype = autocast_dtype
        self.timer = timer
        self.stream = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward",
                                       initializer=self._bind_worker)
        self._captions: list[str] = []
        self._sources: torch.Tensor | None = None
        self._images: list[torch.Tensor] = []
        self._futures: list[Future] = []

    def _bind_worker(self) -> None:
        devices.set_device(self.device)
        self.stream = devices.new_stream(self.device)
        if not devices.is_accelerator(self.device):
            # Sampling runs on this CPU too. Intra-op threads are per calling thread: a worker with
            # the default team made every later op of the main thread ~30% slower (measured with a
            # 512x512 matmul loop), one thread here does not.
            torch.set_num_threads(1)

    def begin(self, captions: Sequence[str], sources: torch.Tensor | None = None) -> None:
        """Start a batch whose sample i has caption captions[i] (and source image sources[i] when
        the family edits)."""
        if self._futures:
            raise RuntimeError("ChunkScorer.begin called before the previous batch was finished")
        self._captions = list(captions)
        self._sources = sources
        self._images = []

    def on_chunk(self, rows: slice, x0: torch.Tensor) -> None:
        """Decode rows of the batch (x0 [b, L, C]) now and queue their scoring on the worker."""
        with self.timer.phase("decode"):
            images = decode_images(self.vae, x0, self.rollout_cfg, self.device, self.autocast_dtype, family=self.family)
        ready = devices.record_event(self.device)
        self._images.append(images)
        sources = None if self._sources is None else self._sources[rows]
        self._futures.append(self.pool.submit(self._score, images, self._captions[rows], ready, sources))

    def _score(self, images: torch.Tensor, captions: list[str], ready,
               sources: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], float]:
        start = time.perf_counter()
        if self.stream is not None:
            # The images were allocated on the main stream; tell the caching allocator they are
            # also used here so their memory is not handed out again too early.
            images.record_stream(self.stream)
        with devices.on_stream(self.device, self.stream, after=ready):
            extra = {} if sources is None else {"sources": sources}
            raw = self.reward.score_raw(images, captions, **extra)  # CPU tensors: waits for its own work
        return raw, time.perf_counter() - start

    def finish(self) -> ScoredChunks:
        """Wait for every queued chunk; a worker's exception is raised here."""
        futures, self._futures = self._futures, []
        results = [f.result() for f in futures]
        if not results:
            raise RuntimeError("ChunkScorer.finish: no chunk was scored (was on_chunk passed to rollout?)")
        names = results[0][0].keys()
        raw = {name: torch.cat([r[name] for r, _ in results]) for name in names}
        images = torch.cat(self._images)
        self._images = []
        if images.shape[0] != len(self._captions):
            raise RuntimeError(f"scored {images.shape[0]} images for a batch of {len(self._captions)} samples")
        return ScoredChunks(images=images, raw=raw, busy_s=sum(s for _, s in results))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def share_rewards(dims, rewards: RewardResult | None, names: Sequence[str], batch: int,
                  device: torch.device) -> RewardResult:
    """The scores of a sequence group's samples on every rank of the group: sp rank 0 passes its
    RewardResult (it decoded and scored), the others None; one broadcast over ``dims.sp_group``
    from the group's first (global) rank of a contiguous float32 [1 + R, B] tensor: the totals,
    then the raw scores of ``names`` (the reward components, in order). NaN (a dropped sample)
    travels as it is. sp = 1: ``rewards`` unchanged, no collective."""
    if dims.sp == 1:
        return rewards
    import torch.distributed as dist

    if dims.sp_rank == 0:
        rows = [rewards.total, *(rewards.per_reward[n] for n in names)]
        buf = torch.stack([r.float() for r in rows]).to(device).contiguous()
    else:
        buf = torch.empty(1 + len(names), batch, dtype=torch.float32, device=device)
    dist.broadcast(buf, src=dims.rank - dims.sp_rank, group=dims.sp_group)
    if dims.sp_rank == 0:
        return rewards  # its own tensors: the broadcast sent them as they are
    buf = buf.cpu()
    return RewardResult(total=buf[0].clone(), per_reward={n: buf[i + 1].clone() for i, n in enumerate(names)})
