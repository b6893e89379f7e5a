"""A reward that records the source images it is given (the trainer's editing path), for the forked
2-rank runs of test_kontext_training.py: registered in this process before the ranks fork."""

from __future__ import annotations

import os
from pathlib import Path

import torch

RECORD_ENV = "FLUX_GRPO_TEST_SOURCE_RECORD"


class RecordingSourceReward:
    """Saves each call's (prompts, sources, images) under $FLUX_GRPO_TEST_SOURCE_RECORD/rank<R>-<N>.pt and
    scores each image by its mean brightness (a real, varying score)."""

    name = "record_sources"
    uses_sources = True

    def __init__(self, device="cpu", dtype=None, batch_size=8):
        self.calls = 0

    def __call__(self, images, prompts, sources=None):
        folder = Path(os.environ[RECORD_ENV])
        folder.mkdir(parents=True, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        saved = torch.empty(0) if sources is None else sources.detach().float().cpu()
        torch.save({"prompts": list(prompts), "sources": saved, "images": images.detach().float().cpu()},
                   folder / f"rank{rank}-{self.calls}.pt")
        self.calls += 1
        return images.detach().float().mean(dim=(1, 2, 3)).cpu()


def register() -> None:
    from fastvideo.rewards import registry

    if "record_sources" not in registry.available_rewards():
        registry.register_reward("record_sources", RecordingSourceReward)


def run_recorded(argv: list[str], record: Path) -> None:
    """A forked 2-rank training run whose record_sources reward saves its calls under ``record``."""
    from helpers import torchrun

    register()
    os.environ[RECORD_ENV] = str(record)
    try:
        proc = torchrun(argv, timeout=600)
    finally:
        os.environ.pop(RECORD_ENV, None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
