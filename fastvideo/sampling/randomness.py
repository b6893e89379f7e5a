"""Every random draw of a run, addressed by what it is for, not by when it happens.

Each draw is made on the CPU by a fresh ``torch.Generator`` seeded with a stable hash of
(seed, kind, iteration, global id[, step]). The numbers therefore do not depend on the device,
the world size, the rollout batch size or the order of the calls: sample 17's noise at step 5 of
iteration 3 is the same tensor on a laptop CPU, on 16 NPUs and on 8 GPUs. Callers move the CPU
tensors to their device.

Capture / replay (alignment "method A"): ``RandomSource(seed).capture(dir)`` records every draw
to ``dir/randomness_{iteration:06d}[_rank{r}].safetensors`` (one key per id: kind/iteration/id/step);
``RandomSource(any_seed).replay(dir)`` returns the recorded tensors instead of generating, so a
second implementation (or another seed, or another device) sees exactly the captured run's noise.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import torch

from fastvideo.utils import atomic_write_bytes
from fastvideo.errors import MissingInputError

INITIAL_NOISE = "initial_noise"
STEP_NOISE = "step_noise"
TIMESTEP_PERM = "timestep_perm"
DATA_ORDER = "data_order"
EVAL_NOISE = "eval_noise"
EVAL_STEP_NOISE = "eval_step_noise"
WINDOW_START = "window_start"
SAMPLE_ORDER = "sample_order"
TRAIN_NOISE = "train_noise"

GENERATE, CAPTURE, REPLAY = "generate", "capture", "replay"

Ids = Sequence[int] | torch.Tensor


def stable_seed(*parts: object) -> int:
    """A 63-bit generator seed from a blake2b hash of ``parts``; identical in every process and
    Python version (``hash()`` is salted per process, so it cannot be used)."""
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & (2**63 - 1)


def _ids_list(ids: Ids) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.ndim != 1:
            raise ValueError(f"sample ids must be a 1-d tensor or a list of ints, got shape {tuple(ids.shape)}")
        return [int(i) for i in ids.tolist()]
    return [int(i) for i in ids]


def draw_key(kind: str, iteration: int, sample_id: int | None = None, step: int | None = None) -> str:
    """Name of one recorded draw: kind/iteration[/id[/step]] (data_order uses the epoch)."""
    parts = [kind, str(int(iteration))]
    if sample_id is not None:
        parts.append(str(int(sample_id)))
    if step is not None:
        parts.append(str(int(step)))
    return "/".join(parts)


class MissingDrawError(KeyError):
    """Replay asked for a draw that the captured run never made."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class RandomSource:
    """Seeded, addressable randomness; every draw comes back as a CPU tensor.

    Modes: generate (default), capture(dir) (generate and record), replay(dir) (read records;
    the seed is then unused). ``capture`` and ``replay`` return self, so
    ``RandomSource(seed).replay(dir)`` reads naturally.
    """

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.mode = GENERATE
        self.dir: Path | None = None
        self.rank = 0
        self.world_size = 1
        self._pending: dict[tuple[str, int], dict[str, torch.Tensor]] = {}  # (file tag, index) -> records
        self._dirty: set[tuple[str, int]] = set()  # pending files with draws not yet on disk
        self._replay_cache: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------ modes
    def capture(self, directory: str | Path, rank: int | None = None, world_size: int | None = None) -> "RandomSource":
        """Record every draw from now on. Files are written by ``flush()`` and whenever a draw of a
        later iteration starts (an iteration's file is rewritten if it gets more draws later)."""
        from fastvideo import devices

        self.flush()
        self.mode = CAPTURE
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = devices.rank() if rank is None else int(rank)
        self.world_size = devices.world_size() if world_size is None else int(world_size)
        return self

    def replay(self, directory: str | Path) -> "RandomSource":
        """Serve every draw from the files of a captured run (all ranks' files of an iteration)."""
        directory = Path(directory)
        if not directory.is_dir():
            raise MissingInputError(
                f"randomness replay folder {str(directory)!r} does not exist; point it at the folder a "
                "run wrote with RandomSource.capture (its randomness_*.safetensors files)"
            )
        self.flush()
        self.mode = REPLAY
        self.dir = directory
        self._replay_cache.clear()
        return self

    # ------------------------------------------------------------------ draws
    def initial_noise(self, iteration: int, sample_ids: Ids, shape_per_sample: Sequence[int]) -> torch.Tensor:
        """N(0, I) float32 [B, *shape_per_sample], one row per id. For init_same_noise pass the
        group (prompt) id of each sample: equal ids give equal noise."""
        shape = tuple(int(s) for s in shape_per_sample)
        return self._per_id(INITIAL_NOISE, iteration, sample_ids, None, shape, lambda g: torch.randn(shape, generator=g))

    def step_noise(self, iteration: int, sample_ids: Ids, step: int, shape_per_sample: Sequence[int]) -> torch.Tensor:
        """eps ~ N(0, I) float32 [B, *shape_per_sample] of SDE step ``step`` for each sample."""
        shape = tuple(int(s) for s in shape_per_sample)
        return self._per_id(STEP_NOISE, iteration, sample_ids, step, shape, lambda g: torch.randn(shape, generator=g))

    def timestep_permutations(self, iteration: int, sample_ids: Ids, n: int) -> torch.Tensor:
        """int64 [B, n]: a random permutation of range(n) for each sample (which transitions the
        update phase trains, and in which order)."""
        n = int(n)
        return self._per_id(TIMESTEP_PERM, iteration, sample_ids, None, (n,), lambda g: torch.randperm(n, generator=g))

    def train_noise(self, iteration: int, sample_ids: Ids, steps: Ids, shape_per_sample: Sequence[int]) -> torch.Tensor:
        """eps ~ N(0, I) float32 [B, *shape_per_sample] with which a forward-process objective (NFT)
        noises sample ids[i]'s clean latent at its trained step steps[i] (one draw per pair)."""
        shape = tuple(int(s) for s in shape_per_sample)
        ids, steps = _ids_list(sample_ids), _ids_list(steps)
        if len(ids) != len(steps) or not ids:
            raise ValueError(f"train_noise: {len(ids)} sample ids for {len(steps)} steps")
        make = lambda g: torch.randn(shape, generator=g)  # noqa: E731
        return torch.stack([self._draw(TRAIN_NOISE, iteration, i, k, shape, make) for i, k in zip(ids, steps)])

    def window_start(self, iteration: int, n: int) -> int:
        """Uniform in range(n): where the SDE window of ``iteration`` starts (MixGRPO's random
        strategy, Flow-GRPO-Fast); one draw per iteration, the same on every rank."""
        n = int(n)
        if n < 1:
            raise ValueError(f"window_start needs n >= 1, got {n}")
        value = self._draw(WINDOW_START, iteration, None, None, (), lambda g: torch.randint(n, (), generator=g))
        return int(value)

    def sample_order(self, iteration: int, key_id: int, n: int, part: int = 0) -> torch.Tensor:
        """int64 [n]: a permutation of range(n) for MixGRPO's --advantage_rerange_strategy, keyed
        by ``key_id`` (the rank's first global sample id) and ``part`` (one draw per list shuffled)."""
        n = int(n)
        return self._draw(SAMPLE_ORDER, iteration, key_id, part, (n,), lambda g: torch.randperm(n, generator=g))

    def data_order(self, epoch: int, n: int) -> torch.Tensor:
        """int64 [n]: the permutation of the prompt dataset for ``epoch`` (same on every rank)."""
        n = int(n)
        return self._draw(DATA_ORDER, epoch, None, None, (n,), lambda g: torch.randperm(n, generator=g))

    def eval_noise(self, prompt: str, image_index: int, shape_per_sample: Sequence[int],
                   step: int | None = None) -> torch.Tensor:
        """N(0, I) float32 [*shape_per_sample] for image ``image_index`` of evaluation prompt
        ``prompt``: its initial noise (step None) or its step noise at ``step`` (eta > 0).

        Keyed on the prompt's text and the image index only, not on the iteration, rank or
        batch, so every evaluation of every checkpoint, at any world size, sees the same noise."""
        shape = tuple(int(s) for s in shape_per_sample)
        kind = EVAL_NOISE if step is None else EVAL_STEP_NOISE
        # The prompt's hash stands in for a sample id; the image index and step follow it.
        key_id = stable_seed("eval_prompt", prompt)
        sub = int(image_index) if step is None else int(image_index) * 100_000 + int(step)
        return self._draw(kind, 0, key_id, sub, shape, lambda g: torch.randn(shape, generator=g))

    # ------------------------------------------------------------------ machinery
    def _per_id(self, kind, iteration, ids, step, shape, make) -> torch.Tensor:
        ids = _ids_list(ids)
        if not ids:
            raise ValueError(f"{kind}: no sample ids given")
        return torch.stack([self._draw(kind, iteration, i, step, shape, make) for i in ids])

    def _draw(self, kind, index, sample_id, step, shape, make) -> torch.Tensor:
        key = draw_key(kind, index, sample_id, step)
        if self.mode == REPLAY:
            return self._replayed(kind, int(index), key, shape)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(stable_seed(self.seed, key))
        value = make(gen)
        if self.mode == CAPTURE:
            self._record(kind, int(index), key, value)
        return value

    @staticmethod
    def _file_tag(kind: str) -> str:
        # Data order is per epoch, evaluation noise has its own file, everything else is per
        # iteration: separate files, no clashes.
        if kind in (EVAL_NOISE, EVAL_STEP_NOISE):
            return "eval"
        return "epoch" if kind == DATA_ORDER else "iteration"

    def _file_stem(self, tag: str, index: int) -> str:
        if tag == "eval":
            return "randomness_eval"
        return f"randomness_{index:06d}" if tag == "iteration" else f"randomness_epoch_{index:06d}"

    def _record(self, kind: str, index: int, key: str, value: torch.Tensor) -> None:
        tag = self._file_tag(kind)
        # A draw of a later iteration means earlier iterations are complete: write them out.
        stale = [k for k in self._pending if k[0] == tag and k[1] < index]
        if stale:
            self._write(stale)
            for k in stale:
                del self._pending[k]
        self._pending.setdefault((tag, index), {})[key] = value.clone()
        self._dirty.add((tag, index))

    def flush(self) -> None:
        """Write every recorded iteration to disk (keeps the records, so later draws of the same
        iteration rewrite a complete file)."""
        if self.mode == CAPTURE:
            self._write(list(self._pending))

    def _write(self, which: list[tuple[str, int]]) -> None:
        from safetensors.torch import save

        for tag, index in which:
            if (tag, index) not in self._dirty:
                continue
            self._dirty.discard((tag, index))
            suffix = f"_rank{self.rank}" if self.world_size > 1 else ""
            path = self.dir / f"{self._file_stem(tag, index)}{suffix}.safetensors"
            records = {k: v.contiguous() for k, v in self._pending[(tag, index)].items()}
            atomic_write_bytes(path, save(records))

    def _replayed(self, kind: str, index: int, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        tag = self._file_tag(kind)
        records = self._replay_cache.get((tag, index))
        if records is None:
            records = self._load(tag, index)
            # Keep only the current index of each file kind in memory.
            for k in [k for k in self._replay_cache if k[0] == tag]:
                del self._replay_cache[k]
            self._replay_cache[(tag, index)] = records
        if key not in records:
            raise MissingDrawError(
                f"replay: draw {key!r} was not captured in {str(self.dir)!r} ({len(records)} draws recorded "
                f"for {tag} {index}). Replay the same configuration (prompts, num_generations, "
                "sampling_steps, init_same_noise) as the captured run."
            )
        value = records[key]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"replay: draw {key!r} was captured with shape {tuple(value.shape)} but shape {tuple(shape)} "
                "is requested now; the resolution or step count differs from the captured run"
            )
        return value.clone()

    def _load(self, tag: str, index: int) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        stem = self._file_stem(tag, index)
        files = sorted(self.dir.glob(f"{stem}.safetensors")) + sorted(self.dir.glob(f"{stem}_rank*.safetensors"))
        if not files:
            raise MissingDrawError(
                f"replay: no {stem}[_rank*].safetensors in {str(self.dir)!r}; the captured run did not reach "
                f"{tag} {index}"
            )
        records: dict[str, torch.Tensor] = {}
        for f in files:
            records.update(load_file(str(f)))
        return records

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict:
        """Draws are addressed by (seed, iteration, sample, step), not by a running state: the seed
        is all there is to restore. Capture/replay folders are flags of the run, not state."""
        return {"seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if "seed" in state and int(state["seed"]) != self.seed and self.mode != REPLAY:
            from fastvideo.errors import CheckpointError

            raise CheckpointError(f"the checkpoint's random draws used seed {state['seed']}, this run seed "
                                  f"{self.seed}: resume with --seed {state['seed']} (or --resume_allow_changes)")

    def __repr__(self) -> str:
        where = f", dir={str(self.dir)!r}" if self.dir is not None else ""
        return f"RandomSource(seed={self.seed}, mode={self.mode}{where})"
