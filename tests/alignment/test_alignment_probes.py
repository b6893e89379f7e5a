"""Layer probes on the tiny FLUX: execution order, determinism, and the locator naming the first
diverging module when one implementation is deliberately perturbed."""

import json

import numpy as np
import pytest
import torch
from alignment_helpers import make_cfg
from PIL import Image

from fastvideo.alignment.compare import DEFAULT_LAYER_TOL, Thresholds, compare_probe_recordings, compare_runs
from fastvideo.alignment.probes import (
    PROBE_INDEX,
    PROBE_TENSORS,
    build_probe_input,
    load_probes,
    record_probes,
    run_probes_for_config,
    select_modules,
)
from fastvideo.config import PROBE_KINDS
from fastvideo.models import flux
from fastvideo.tools.compare_runs import main


@pytest.fixture(scope="module")
def models(tiny_flux_dir):
    return flux.load_transformer(tiny_flux_dir).eval(), flux.load_vae(tiny_flux_dir)


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe_ref")
    record_probes(*models, PROBE_KINDS, out)
    return out


def test_entries_in_execution_order(models, reference):
    rec = load_probes(reference)
    keys = [e.key for e in rec.entries]
    assert keys[:2] == ["pos_embed", "pos_embed#1"]  # RoPE (cos, sin) runs before any block
    assert {e.kind for e in rec.entries} == set(PROBE_KINDS)
    # children return before their parents: q/k norms, then attention, then the block
    order = {k: i for i, k in enumerate(keys)}
    block = "transformer_blocks.0"
    assert order[f"{block}.attn.norm_q"] < order[f"{block}.attn"] < order[block]
    assert order["transformer_blocks.0"] < order["single_transformer_blocks.0"] < order["norm_out"]
    assert keys[-1] == "vae.decoder.conv_out" and order["vae.decoder.mid_block"] < order["vae.decoder.up_blocks.0"]
    # the files: json order == entries, tensors hold exactly those keys
    index = json.loads((reference / PROBE_INDEX).read_text())
    assert [e["key"] for e in index["entries"]] == keys
    assert set(rec.tensors) == set(keys)
    assert index["input"]["seed"] == 0 and index["device_type"] == "cpu"
    # the block's tuple output: text stream first, image stream second (diffusers 0.32 order)
    shapes = {e.key: e.shape for e in rec.entries}
    assert shapes["transformer_blocks.0"][1] == 16 and shapes["transformer_blocks.0#1"][1] == 64


def test_outputs_match_a_direct_forward(models, reference):
    """The recorded RoPE and the decoded image equal what diffusers computes for the same input."""
    transformer, vae = models
    rec = load_probes(reference)
    inp = build_probe_input(transformer.config, vae.config)
    cos, sin = transformer.pos_embed(torch.cat([inp.txt_ids, inp.img_ids]))
    torch.testing.assert_close(rec.tensors["pos_embed"], cos.float(), rtol=0, atol=0)
    torch.testing.assert_close(rec.tensors["pos_embed#1"], sin.float(), rtol=0, atol=0)
    with torch.no_grad():
        image = vae.decode(inp.vae_latent, return_dict=False)[0]
    torch.testing.assert_close(rec.tensors["vae.decoder.conv_out"], image, rtol=0, atol=0)


def test_same_input_same_outputs(models, reference, tmp_path):
    again = record_probes(*models, PROBE_KINDS, tmp_path)
    cmp = compare_probe_recordings(load_probes(reference), again, DEFAULT_LAYER_TOL)
    assert cmp.first_failure is None and max(e.rel_err for e in cmp.entries) == 0.0


# The perturbations patch the classes of the tiny model's own modules, so they hit the same layers on
# both library lines (diffusers 0.32: embeddings.FluxPosEmbed, normalization.RMSNorm,
# FluxAttnProcessor2_0; 0.42: transformer_flux.FluxPosEmbed, torch.nn.RMSNorm, FluxAttnProcessor).


def _perturb_rope(monkeypatch, transformer):
    cls = type(transformer.pos_embed)
    orig = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, ids: tuple(t + 1e-2 for t in orig(self, ids)))


def _perturb_rms_norm(monkeypatch, transformer):
    cls = type(transformer.transformer_blocks[0].attn.norm_q)
    orig = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, x: orig(self, x) * 1.05)


def _perturb_attention(monkeypatch, transformer):
    cls = type(transformer.transformer_blocks[0].attn.processor)
    orig = cls.__call__

    def call(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        return tuple(t * 1.05 for t in out) if isinstance(out, tuple) else out * 1.05

    monkeypatch.setattr(cls, "__call__", call)


def _perturb_group_norm(monkeypatch, transformer):  # only the VAE uses GroupNorm
    orig = torch.nn.GroupNorm.forward
    monkeypatch.setattr(torch.nn.GroupNorm, "forward", lambda self, x: orig(self, x) + 0.1)


@pytest.mark.parametrize("perturb, key, kind", [
    (_perturb_rms_norm, "transformer_blocks.0.attn.norm_q", "norm"),
    (_perturb_attention, "transformer_blocks.0.attn", "attention"),
    (_perturb_group_norm, "vae.decoder.mid_block", "vae"),
])
def test_locator_names_the_perturbed_kind(models, reference, tmp_path, monkeypatch, perturb, key, kind):
    perturb(monkeypatch, models[0])
    bad = record_probes(*models, PROBE_KINDS, tmp_path)
    first = compare_probe_recordings(load_probes(reference), bad, DEFAULT_LAYER_TOL).first_failure
    assert (first.key, first.kind, first.status) == (key, kind, "over")


def test_rope_perturbation_named_first_in_the_report(models, reference, tmp_path, monkeypatch, capsys):
    _perturb_rope(monkeypatch, models[0])
    record_probes(*models, PROBE_KINDS, tmp_path / "npu" / "probes")  # a run folder holding probes/
    out = tmp_path / "report"
    assert main([str(reference), str(tmp_path / "npu"), "--out", str(out)]) == 1
    assert "pos_embed" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    first = summary["probes"]["first_failure"]
    assert (first["key"], first["kind"]) == ("pos_embed", "rope")
    assert first["rel_err"] == pytest.approx(1e-2, rel=0.5)  # +1e-2 on cos values of magnitude <= 1
    report = (out / "report.md").read_text()
    assert "First diverging module (execution order): `pos_embed`" in report and "RoPE" in report
    with Image.open(out / "probes.png") as im:
        assert im.size == (800, 450) and np.asarray(im.convert("L")).std() > 5
    # a looser RoPE tolerance moves the blame downstream, to the attention that consumes it
    loose = compare_runs(reference, tmp_path / "npu", Thresholds(layer_tol={**DEFAULT_LAYER_TOL, "rope": 0.1}))
    assert loose.probes.first_failure.kind == "attention"


def test_kind_selection_and_wrapped_models(models, tmp_path):
    transformer, vae = models
    names = [n for n, _, _ in select_modules(transformer, vae, ["rope", "vae"])]
    assert names[0] == "pos_embed" and all(n == "pos_embed" or n.startswith("vae.decoder.") for n in names)

    class Wrapper(torch.nn.Module):  # how FSDP1 / DDP hold the model
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, **kwargs):
            return self.module(**kwargs)

    plain = record_probes(transformer, None, ["rope", "block"], None)
    wrapped = record_probes(Wrapper(transformer), None, ["rope", "block"], None)
    assert [e.key for e in wrapped.entries] == [e.key for e in plain.entries]
    assert compare_probe_recordings(plain, wrapped, DEFAULT_LAYER_TOL).first_failure is None
    with pytest.raises(ValueError, match="unknown probe kind"):
        select_modules(transformer, vae, ["mlp"])
    with pytest.raises(ValueError, match="needs a VAE"):
        select_modules(transformer, None, ["vae"])


def test_run_probes_for_config(models, tmp_path):
    transformer, vae = models
    cfg = make_cfg(tmp_path / "rec", extra=["--probe_layers", "rope,norm,vae"])
    transformer.train()
    folder = run_probes_for_config(cfg, transformer, vae, torch.device("cpu"))
    assert transformer.training  # mode restored
    transformer.eval()
    assert folder == tmp_path / "rec" / "probes"
    assert (folder / PROBE_TENSORS).is_file()
    assert {e.kind for e in load_probes(tmp_path / "rec").entries} == {"rope", "norm", "vae"}
