"""The reference policy of the KL penalty (--kl_coef): which model predicts the base velocity.

    ref = builders.build_kl_reference(cfg, model, device)   # None when --kl_coef 0
    with ref.policy() as m:                                  # under torch.no_grad()
        v_ref = predict_velocity(m, ...)

Under LoRA the reference is the trained model itself with its adapters switched off (the frozen
base; no second copy of the weights). For full fine-tuning it is a frozen copy of the initial
weights, built and sharded like the model (builders.build_kl_reference).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


class AdapterOffReference:
    def __init__(self, model: nn.Module):
        self.model = model

    @contextlib.contextmanager
    def policy(self) -> Iterator[nn.Module]:
        from fastvideo.training.lora import adapters_disabled

        with adapters_disabled(self.model) as m:
            yield m


class FrozenCopyReference:
    def __init__(self, model: nn.Module):
        self.model = model

    @contextlib.contextmanager
    def policy(self) -> Iterator[nn.Module]:
        yield self.model
