"""--probe_layers all on 2 ranks under FSDP: every kind is recorded and saved (safetensors refused
outputs that share memory: "Some tensors share memory"), equal to the unsharded model's."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_utils import run_distributed, tiny_transformer  # noqa: E402


def _probe_on_ranks(info, out_dir):
    from fastvideo.alignment.probes import load_probes, record_probes, save_probes
    from fastvideo.distributed import fsdp

    kinds = ["rope", "norm", "attention", "block"]
    plain = record_probes(tiny_transformer(), None, kinds, None, size=32, text_len=8)
    model = fsdp.wrap_model(tiny_transformer(), "full", info.device)
    sharded = record_probes(model, None, kinds, None, size=32, text_len=8)
    if info.rank == 0:
        save_probes(sharded, out_dir)
        saved = load_probes(out_dir)
        assert [e.key for e in saved.entries] == [e.key for e in plain.entries]
        worst = max((saved.tensors[k] - plain.tensors[k]).abs().max().item() for k in plain.tensors)
        return len(saved.entries), sorted({e.kind for e in saved.entries}), worst
    return None


def test_probe_layers_all_on_two_ranks(tmp_path):
    count, kinds, worst = run_distributed(_probe_on_ranks, str(tmp_path / "probes"), world_size=2)[0]
    assert count > 8 and kinds == ["attention", "block", "norm", "rope"]
    assert worst < 1e-4  # the same weights, sharded: float32 reductions may differ in order only
