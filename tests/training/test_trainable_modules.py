"""--trainable_modules (training/trainable.py): a 2-rank tiny FLUX step under FSDP1 and under FSDP2
(the latter with --master_weight_type bf16, Flow-Factory's bf16 weights trained in place) trains
exactly the chosen modules: the frozen weights come back bit-equal to the initial files, the chosen
ones moved, and the optimizer holds state for the chosen ones only. The peer's sets are the
Flow-Factory files' (fixture), and built from the published configs on the meta device (no
download) they train the fractions issue 50 measured: 44% of Qwen-Image, 45% Kontext, 66%
Qwen-Image-Edit, 75% FLUX.2 [klein], 98% Z-Image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fastvideo.errors import ConfigError
from fastvideo.training.checkpoint.state_io import load_tree
from fastvideo.training.trainable import PEER_MODULES, select_trainable, trainable_units
from helpers import torchrun, train_args

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "flow_factory_target_modules.json"
CHOSEN = "attn.to_q,ff.net.2"  # the double blocks' image-stream query and FFN output, single blocks' query


def _chosen(name: str) -> bool:
    return any(p in name for p in CHOSEN.split(","))


def test_peer_sets_are_flow_factorys():
    fixture = json.loads(FIXTURE.read_text())
    assert fixture["commit"].startswith("a0b2bc5")
    fams = fixture["families"]
    assert set(fams["flux2"]["modules"]) == set(fams["flux2_klein"]["modules"])  # one family here: dev and klein
    for family, entry in fams.items():
        if family != "flux2_klein":
            assert set(PEER_MODULES[family]) == set(entry["modules"]), family
    assert set(PEER_MODULES["flux2_edit"]) == set(fams["flux2_klein"]["modules"])  # klein editing: klein's list


@pytest.mark.slow
def test_a_subset_trains_alone_under_fsdp1_and_fsdp2_bf16(tiny_flux_dir, tiny_embeddings, tmp_path):
    initial = load_file(str(Path(tiny_flux_dir) / "transformer" / "diffusion_pytorch_model.safetensors"))
    runs = {"fsdp1": {}, "fsdp2_bf16": {"fsdp_version": 2, "master_weight_type": "bf16", "mixed_precision": "bf16"}}
    for name, flags in runs.items():
        out = tmp_path / name
        proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=1, checkpointing_steps=1,
                                   save_images_every=0, trainable_modules=CHOSEN, **flags))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        assert f"--trainable_modules {CHOSEN}: training" in proc.stdout
        after = load_file(str(out / "checkpoint-1" / "diffusion_pytorch_model.safetensors"))
        assert after.keys() == initial.keys()
        dtype = torch.bfloat16 if flags else torch.float32
        trained = [k for k in after if _chosen(k)]
        assert trained and len(trained) < len(after)
        for key, value in after.items():
            assert value.dtype == dtype, (name, key)  # bf16 weights stay bf16 (no fp32 master)
            start = initial[key].to(dtype)
            if _chosen(key):
                assert not torch.equal(value, start), (name, key)  # stepped (bf16: in place)
            else:
                assert torch.equal(value, start), (name, key)  # frozen: bit-equal
        state = load_tree(out / "checkpoint-1", "optimizer")["state"]
        assert set(state) == set(trained), name  # AdamW state for the chosen weights only
        moments = {v.dtype for s in state.values() for k, v in s.items() if k.startswith("exp_avg")}
        assert moments == {dtype}, name  # bf16 mode: AdamW's moments in bf16 too, as the peer's


def test_unknown_patterns_and_lora_are_refused(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="nope matches no parameter"):
        select_trainable(model, "0,nope", "flux")
    with pytest.raises(ConfigError, match="no default set for family 'toy'"):
        select_trainable(model, "peer", "toy")
    assert select_trainable(model, "1.weight,1.bias", "flux") == (6, 12)
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]
    unit = trainable_units(model)  # FSDP1: the trained Linear its own unit, nothing else
    assert [unit(m) for m in (model, model[0], model[1])] == [False, False, True]
    select_trainable(model, "1.weight", "flux")  # half a module: FSDP1 cannot shard it apart
    with pytest.raises(ConfigError, match="trains 1.weight but not all of its module's parameters"):
        trainable_units(model)
    assert select_trainable(model, "all", "flux") == (12, 12) and all(p.requires_grad for p in model.parameters())
    from fastvideo.config import build_parser, validate_args

    args = train_args("x.json", "m", tmp_path, trainable_modules="peer")
    with pytest.raises(ConfigError, match="with --use_lora choose"):
        validate_args(build_parser().parse_args(args + ["--use_lora"]))
    with pytest.raises(ConfigError, match="--trainable_modules ','"):
        validate_args(build_parser().parse_args(train_args("x.json", "m", tmp_path, trainable_modules=",")))
    assert validate_args(build_parser().parse_args(args)).model.trainable_modules == "peer"


# The published transformer configs (config.json of black-forest-labs/FLUX.1-Kontext-dev, Qwen/Qwen-Image
# and Qwen-Image-Edit-2509 (one architecture), black-forest-labs/FLUX.2-klein-4B, Tongyi-MAI/Z-Image),
# the parameter shapes only -> issue 50's fractions.
_FLUX1 = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
              num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True)
_QWEN = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
             num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False)
_KLEIN = dict(patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
              num_attention_heads=24, joint_attention_dim=7680, mlp_ratio=3.0, guidance_embeds=False)
_ZIMAGE = dict(dim=3840, n_layers=30, n_refiner_layers=2, n_heads=30, n_kv_heads=30, cap_feat_dim=2560)
REAL = [("kontext", "FluxTransformer2DModel", _FLUX1, 0.452), ("qwen_image", "QwenImageTransformer2DModel", _QWEN, 0.444),
        ("qwen_image_edit", "QwenImageTransformer2DModel", _QWEN, 0.665),
        ("flux2", "Flux2Transformer2DModel", _KLEIN, 0.755), ("zimage", "ZImageTransformer2DModel", _ZIMAGE, 0.977)]


@pytest.mark.parametrize("family,cls,config,fraction", REAL, ids=[r[0] for r in REAL])
def test_peer_fractions_on_the_real_configs(family, cls, config, fraction):
    import diffusers

    if not hasattr(diffusers, cls):
        pytest.skip(f"{cls} is not in diffusers {diffusers.__version__} (the current library line has it)")
    with torch.device("meta"):
        model = getattr(diffusers, cls)(**config)
    trained, total = select_trainable(model, "peer", family)
    assert abs(trained / total - fraction) < 1e-3, (family, trained / total)
