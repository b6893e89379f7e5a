"""Exponential moving average of the trainable weights, kept shard by shard.

    ema = EMA(model, decay=0.995)          # after wrap_model: shadows what this rank holds
    ...optimizer.step(); ema.update(model)
    with ema.swapped_in(model):            # evaluate / sample with the EMA weights
        ...
    full = ema.full_state_dict(model)      # collective: gathered, parameter names as the model's

Each rank keeps a float32 copy of exactly the tensors it owns: one flat shard per FSDP unit
(FSDP1), the local tensor of each DTensor (FSDP2), or the full parameters (DDP / one process).
update() is element-wise on those local tensors, so it needs no communication and costs
1/world_size of the model per rank under sharding. Gathering happens only through the wrapper's own
state-dict machinery (swap the EMA in, take the full state dict, swap back).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from fastvideo.distributed import fsdp


def _local(param: torch.Tensor) -> torch.Tensor:
    """The storage this rank owns: a DTensor's local shard, else the tensor itself (for an FSDP1
    flat parameter outside forward/backward, that is this rank's flat shard)."""
    to_local = getattr(param, "to_local", None)
    return to_local() if callable(to_local) else param.data


class EMA:
    """shadow <- decay * shadow + (1 - decay) * param, per local shard, in float32."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = False):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay {decay} must be in (0, 1)")
        self.decay = float(decay)
        self.warmup = warmup  # --ema_warmup: warmed_up_decay
        self.num_updates = 0
        self._model = model
        self._params = fsdp.trainable_parameters(model)
        if not self._params:
            raise ValueError("the model has no trainable parameters to average")
        # float32 even for bf16 master weights: (1 - decay) * delta would round away in bf16.
        with torch.no_grad():
            self.shadow = [_local(p).detach().to(torch.float32, copy=True) for p in self._params]

    def _check_model(self, model: nn.Module | None) -> None:
        if model is None:
            return
        current = fsdp.trainable_parameters(model)
        if len(current) != len(self._params) or any(a is not b for a, b in zip(current, self._params)):
            raise ValueError(
                "EMA was built for different parameters than this model's; build the EMA after wrap_model "
                "(on the wrapped model) and pass that same model"
            )

    def decay_at(self, step: int | None) -> float:
        """The decay of an update after ``step`` optimizer steps: the constant decay, or with warmup
        min((1 + step) / (10 + step), decay) (Flow-GRPO's and DiffusionNFT's EMAModuleWrapper), so
        the first updates follow the weights closely instead of holding the initial ones; without a
        step, the updates so far count (this one included)."""
        if not self.warmup:
            return self.decay
        s = self.num_updates + 1 if step is None else int(step)
        return min((1.0 + s) / (10.0 + s), self.decay)

    @torch.no_grad()
    def update(self, model: nn.Module | None = None, step: int | None = None) -> None:
        """One EMA step from the current weights (call after optimizer.step(); no communication).
        step: optimizer steps so far, for the warm-up (decay_at)."""
        self._check_model(model)
        weight = 1.0 - self.decay_at(step)
        for shadow, param in zip(self.shadow, self._params):
            shadow.lerp_(_local(param).to(torch.float32), weight)
        self.num_updates += 1

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module | None = None) -> Iterator[None]:
        """Run the model with the EMA weights inside the block; the training weights come back after
        it, bit for bit. Costs one extra copy of the local shards. Not re-entrant."""
        target = model if model is not None else self._model
        # Else FSDP1 would keep computing with gathered old weights, and under FSDP2 the modules
        # would still hold the root's gathered tensors instead of the shards.
        fsdp.free_unsharded_params(target)
        self._check_model(model)
        with torch.no_grad():
            backup = [_local(p).detach().clone() for p in self._params]
            for shadow, param in zip(self.shadow, self._params):
                _local(param).copy_(shadow)
        try:
            yield
        finally:
            fsdp.free_unsharded_params(target)
            with torch.no_grad():
                for saved, param in zip(backup, self._params):
                    _local(param).copy_(saved)

    # ------------------------------------------------------------------ local (per-rank) state
    def state_dict(self) -> dict:
        """This rank's shadows (valid only for the same model, wrapping and world size)."""
        return {"decay": self.decay, "num_updates": self.num_updates, "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        shadow = state["shadow"]
        if len(shadow) != len(self.shadow) or any(a.shape != b.shape for a, b in zip(shadow, self.shadow)):
            raise ValueError(
                "EMA state does not match this model's local shards (different model, wrapping or world size); "
                "load the full EMA state dict with load_full_state_dict instead"
            )
        with torch.no_grad():
            for dst, src in zip(self.shadow, shadow):
                dst.copy_(src)
        self.decay = float(state["decay"])
        self.num_updates = int(state["num_updates"])

    # ------------------------------------------------------------------ full (gathered) state
    def full_state_dict(self, model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
        """Collective. The EMA weights as a full model state dict (parameter names as the unwrapped
        model's; non-trainable entries are the model's own, or left out with trainable_only) on
        rank 0, {} on the other ranks."""
        with self.swapped_in(model):
            state = fsdp.full_model_state_dict(model, trainable_only)
            state = _without_aliases(state, model)
        return state

    def load_full_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor], num_updates: int | None = None,
                             strict: bool = True):
        """Collective. Set the shadows from a full EMA state dict held by rank 0 (any world size);
        strict=False for an adapters-only dict (LoRA)."""
        with self.swapped_in(model):  # restores the training weights afterwards
            fsdp.load_full_model_state_dict(model, state, strict=strict)
            with torch.no_grad():
                for shadow, param in zip(self.shadow, self._params):
                    shadow.copy_(_local(param))
        if num_updates is not None:
            self.num_updates = int(num_updates)


def _without_aliases(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Copy the values that share storage with the model's tensors (a single process returns the
    parameters themselves), so that restoring the training weights leaves them intact."""
    live = {_local(t).untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    return {
        k: (v.clone() if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in live else v)
        for k, v in state.items()
    }


class WeightCopy(EMA):
    """A shard-local float32 copy of the trainable weights moved toward them with each step's own
    decay (an objective's old policy, e.g. DiffusionNFT's): built for objectives through
    ObjectiveContext.copy_weights, so that they need not import the training package."""

    def __init__(self, model: nn.Module):
        super().__init__(model, decay=0.5)  # a placeholder: step() sets every update's decay

    @torch.no_grad()
    def step(self, decay: float) -> None:
        """copy <- decay * copy + (1 - decay) * current (decay 0: an exact copy)."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"weight-copy decay {decay} must be in [0, 1)")
        self.decay = float(decay)
        if decay == 0.0:
            for shadow, param in zip(self.shadow, self._params):
                shadow.copy_(_local(param))
            self.num_updates += 1
        else:
            self.update()
