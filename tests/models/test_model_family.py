"""The model-family protocol (fastvideo.models.base): registry, Conditioning, FluxFamily against the
FLUX functions, the dataset through the family, and a toy family sampled by the rollout engine."""

import json
import sys

import pytest
import torch

from fastvideo.errors import UserError
from fastvideo.models import base, flux, registry
from fastvideo.models.base import TensorConditioning
from fastvideo.models.registry import get_model_family
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)


# ---------------------------------------------------------------- registry
def test_unknown_family_is_a_user_error_listing_the_valid_names():
    with pytest.raises(registry.UnknownModelFamilyError) as err:
        get_model_family("sd7")
    assert isinstance(err.value, UserError)
    assert "unknown model family 'sd7'" in str(err.value) and "flux" in str(err.value)
    with pytest.raises(UserError, match="cannot import 'no_such_pkg.mod'.*built-in families: flux"):
        get_model_family("no_such_pkg.mod:Thing")


def test_flux_is_registered_with_its_settings():
    fam = get_model_family("flux", guidance_scale=2.0, quantize_timestep=False)
    assert isinstance(fam, flux.FluxFamily) and fam.name == "flux"
    assert (fam.guidance_scale, fam.quantize_timestep) == (2.0, False)
    assert "flux" in registry.model_family_names()


def test_a_plugin_path_imports_the_module_which_registers_itself(tmp_path, monkeypatch):
    (tmp_path / "my_family_plugin.py").write_text(
        "from toy_family import ToyFamily\n"
        "from fastvideo.models.registry import register_model_family\n"
        "class Shifted(ToyFamily):\n"
        "    name = 'shifted'\n"
        "register_model_family('shifted', Shifted)\n"
        "def make_shifted(**settings):\n"
        "    return Shifted(**settings)\n"
        "def make_str(**settings):\n"
        "    return 'not a family'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fam = get_model_family("my_family_plugin:Shifted", offset=0.5)
    assert type(fam).__name__ == "Shifted" and fam.offset == 0.5
    assert type(get_model_family("shifted")).__name__ == "Shifted"  # registered by the import
    with pytest.raises(UserError, match="has no 'Nope'"):
        get_model_family("my_family_plugin:Nope")
    for path, needle in [("os:path", "it is a module, not a family"), ("os:sep", "it is a str, not a family"),
                         ("collections:OrderedDict", "OrderedDict is a class but not a ModelFamily"),
                         ("my_family_plugin:make_str", "built a str, not a ModelFamily")]:
        with pytest.raises(UserError, match=needle):
            get_model_family(path, **({"offset": 0.5} if path.endswith("make_str") else {}))
    assert get_model_family("my_family_plugin:make_shifted", offset=0.25).offset == 0.25  # a factory function
    sys.modules.pop("my_family_plugin", None)


def test_a_taken_name_is_refused_and_the_same_factory_again_is_a_no_op(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(ValueError, match="'flux' is already registered .*FluxFamily.*pick another name"):
        registry.register_model_family("flux", _Marked)
    registry.register_model_family("flux", flux.FluxFamily)  # the same factory: allowed, nothing changes
    assert registry.family_factory("flux") is flux.FluxFamily


# ---------------------------------------------------------------- conditioning
def test_tensor_conditioning_select_repeat_and_to():
    a = torch.arange(12.0).view(3, 4)
    shared = torch.zeros(4, 3)
    cond = TensorConditioning({"a": a, "b": torch.tensor([10, 11, 12])}, {"ids": shared})
    assert len(cond) == 3
    sel = cond.select(torch.tensor([2, 0]))
    assert torch.equal(sel["a"], a[[2, 0]]) and sel["b"].tolist() == [12, 10] and sel["ids"] is shared
    assert torch.equal(cond.select(slice(1, 3))["a"], a[1:])
    rep = cond.repeat_interleave(2)
    assert rep["b"].tolist() == [10, 10, 11, 11, 12, 12] and len(rep) == 6 and rep["ids"] is shared
    moved = cond.to("meta")
    assert moved["a"].device.type == "meta" and moved["ids"].device.type == "meta"
    assert set(cond.to_tensors()) == {"a", "b", "ids"}
    rec = cond.record(1)
    assert torch.equal(rec["a"], a[1]) and rec["ids"] is shared
    with pytest.raises(ValueError, match="differ in batch size"):
        TensorConditioning({"a": a, "b": torch.zeros(2)})


# ---------------------------------------------------------------- FLUX
@pytest.fixture(scope="module")
def tiny(tiny_flux_dir):
    transformer = flux.load_transformer(tiny_flux_dir).eval()
    vae = flux.load_vae(tiny_flux_dir)
    encoders = flux.load_text_encoders(tiny_flux_dir)
    return transformer, vae, encoders


@pytest.mark.parametrize("quantize", [True, False])
def test_flux_family_velocity_is_predict_velocity_bit_for_bit(tiny, quantize):
    transformer, vae, encoders = tiny
    fam = flux.FluxFamily(guidance_scale=2.5, quantize_timestep=quantize)
    prompts = ["a cat", "a red barn"]
    cond = fam.encode_prompts(encoders, prompts, 16)
    embeds, pooled, text_ids = flux.encode_prompts(encoders, prompts, 16)
    assert torch.equal(cond["prompt_embeds"], embeds) and torch.equal(cond["pooled"], pooled)
    assert torch.equal(cond["text_ids"], text_ids)
    layout = fam.layout(32, 48, vae, transformer, "cpu")
    assert layout.tokens == (2 * 3, 64) and layout.latent_hw == (4, 6)
    x = torch.randn(2, 6, 64, generator=torch.Generator().manual_seed(0))
    sig = torch.tensor([0.8374, 0.41])
    ours = fam.velocity(transformer, x, sig, cond, layout)
    ref = flux.predict_velocity(transformer, x, sig, embeds, pooled, text_ids, flux.image_ids(4, 6), 2.5, quantize)
    assert ours.dtype == torch.float32 and torch.equal(ours, ref)
    images = fam.decode(vae, x, layout)
    assert torch.equal(images, flux.decode_latents(vae, x, 4, 6)) and images.shape == (2, 3, 32, 48)


def test_flux_block_classes_are_what_fsdp_finds_by_default(tiny):
    from fastvideo.distributed.fsdp import default_block_classes

    transformer = tiny[0]
    assert set(flux.FluxFamily().block_classes()) == set(default_block_classes(transformer))
    assert len(flux.FluxFamily().blocks(transformer)) == (transformer.config.num_layers
                                                           + transformer.config.num_single_layers)


def test_dataset_reads_a_folder_in_the_old_layout_through_the_family(tmp_path):
    """Files and json exactly as 919d5af's preprocessing wrote them (upstream DanceGRPO's layout)."""
    from fastvideo.data.dataset import PromptEmbeddingDataset

    g = torch.Generator().manual_seed(0)
    entries, tensors = [], []
    for sub in ("prompt_embed", "pooled_prompt_embeds", "text_ids"):
        (tmp_path / sub).mkdir()
    for i, caption in enumerate(["a cat", "a dog"]):
        e, p, ids = torch.randn(6, 4, generator=g), torch.randn(3, generator=g), torch.zeros(6, 3)
        torch.save(e, tmp_path / "prompt_embed" / f"{i}.pt")
        torch.save(p, tmp_path / "pooled_prompt_embeds" / f"{i}.pt")
        torch.save(ids, tmp_path / "text_ids" / f"{i}.pt")
        entries.append({"prompt_embed_path": f"{i}.pt", "text_ids": f"{i}.pt",
                        "pooled_prompt_embeds_path": f"{i}.pt", "caption": caption})
        tensors.append((e, p, ids))
    (tmp_path / "videos2caption.json").write_text(json.dumps(entries, indent=4))
    ds = PromptEmbeddingDataset(tmp_path / "videos2caption.json", family=flux.FluxFamily())
    cond, captions = ds.stack([ds[1], ds[0]])
    assert captions == ["a dog", "a cat"] and ds.dims() == (6, 4, 3)
    assert torch.equal(cond["prompt_embeds"], torch.stack([tensors[1][0], tensors[0][0]]))
    assert torch.equal(cond["pooled"], torch.stack([tensors[1][1], tensors[0][1]]))
    assert torch.equal(cond["text_ids"], tensors[1][2])


def test_preprocessing_writes_the_old_layout(tmp_path):
    from fastvideo.data_preprocess.embeddings import caption_entries, save_prompt_record, subdirs

    assert subdirs(family=FLUX) == ("prompt_embed", "pooled_prompt_embeds", "text_ids")
    keys = ["prompt_embed_path", "text_ids", "pooled_prompt_embeds_path", "caption"]
    assert list(caption_entries(["x"], family=FLUX)[0]) == keys
    for sub in subdirs(family=FLUX):
        (tmp_path / sub).mkdir()
    cond = TensorConditioning({"prompt_embeds": torch.ones(2, 3, 4), "pooled": torch.ones(2, 5)},
                              {"text_ids": torch.zeros(3, 3)})
    save_prompt_record(tmp_path, 7, cond.record(1), family=FLUX)
    assert torch.load(tmp_path / "pooled_prompt_embeds" / "7.pt", weights_only=True).shape == (5,)
    assert torch.load(tmp_path / "text_ids" / "7.pt", weights_only=True).shape == (3,)  # upstream: one row


# ---------------------------------------------------------------- a second family
def test_the_cost_model_is_an_optional_role(capsys):
    """A family trains with loading, conditioning and sampling alone; the FLOP / memory estimates
    need FamilyCostModel and refuse a family without it in one line (exit 2)."""
    from toy_family import ToyFamily

    from fastvideo.tools import cost_model

    assert all(isinstance(get_model_family(n), base.FamilyCostModel) for n in ("flux", "sd3"))
    assert isinstance(ToyFamily(), base.ModelFamily) and not isinstance(ToyFamily(), base.FamilyCostModel)
    with pytest.raises(base.NoCostModelError, match="'toy' has no cost model"):
        base.require_cost_model(ToyFamily())
    with pytest.raises(SystemExit) as exit_:
        cost_model.main(["--model_family", "toy_family:ToyFamily"])
    assert exit_.value.code == 2 and "'toy' has no cost model" in capsys.readouterr().err


def test_a_toy_family_rolls_out_and_evaluates_with_no_edit_in_fastvideo():
    from toy_family import ToyFamily, ToyTransformer, ToyVAE

    from fastvideo.sampling.plan import full_sde_plan, window_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout, sample_transitions

    fam = get_model_family("toy_family:ToyFamily")
    assert isinstance(fam, ToyFamily) and isinstance(get_model_family("toy"), ToyFamily)
    torch.manual_seed(0)
    model, vae = ToyTransformer(), ToyVAE()
    cond = fam.encode_prompts(None, ["ab", "abcd"])
    cfg = RolloutConfig(height=16, width=16, sampling_steps=4, eta=0.5, shift=3.0, num_generations=3,
                        rollout_batch_size=2, init_same_noise=True)
    traj = rollout(fam, model, vae, cond, ["ab", "abcd"], [4, 9], cfg, RandomSource(0), 1, "cpu",
                   plan=full_sde_plan(4, 3.0, 4, 2))
    assert traj.latents.shape == (6, 5, 256, 3) and traj.images.shape == (6, 3, 16, 16)
    assert traj.cond["text"][:, 0].tolist() == [2, 2, 2, 4, 4, 4]
    sub = traj.subset([5, 0])
    assert sub.cond["text"][:, 0].tolist() == [4, 2] and torch.equal(sub.latents[0], traj.latents[5])
    # the stored transitions are reproduced by the family's velocity (what the update phase recomputes)
    k = 2
    v = fam.velocity(model, traj.latents[:, k], traj.sigmas[k], traj.cond, traj.layout)
    from fastvideo.sampling.sde import sde_step

    _, logp = sde_step(traj.latents[:, k], v, traj.sigmas[k], traj.sigmas[k + 1], 0.5,
                       prev_sample=traj.latents[:, k + 1])
    torch.testing.assert_close(logp, traj.log_probs[:, k])
    # a windowed plan with a shared ODE prefix runs too
    traj2 = rollout(fam, model, vae, cond, ["ab", "abcd"], [4, 9], cfg, RandomSource(0), 1, "cpu",
                    plan=window_plan(4, 3.0, 2, 1, candidates=4))
    assert traj2.shared_prefix == 2 and torch.equal(traj2.latents[0, :3], traj2.latents[1, :3])
    noise = torch.randn(2, 256, 3, generator=torch.Generator().manual_seed(1))
    plan = full_sde_plan(4, 3.0, 4, 1)
    lat, _, x0 = sample_transitions(fam, model, noise, {}, plan, plan.sigmas, cond, traj.layout, 0.0)
    assert lat.shape == (2, 5, 256, 3) and x0.shape == (2, 256, 3)


# ---------------------------------------------------------------- which family a checkpoint is
class _Marked(base.ModelFamily):  # only its class name matters here
    export_class_name = "MarkedTransformer"


def _register_marked(monkeypatch, *names):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the test's registrations stay in it
    for name in names:
        registry.register_model_family(name, _Marked)


def test_a_class_name_finds_the_family_that_exports_it(monkeypatch):
    _register_marked(monkeypatch, "marked")
    assert registry.family_for_class_name("FluxTransformer2DModel") == "flux"
    assert registry.family_for_class_name("MarkedTransformer") == "marked"
    assert registry.family_for_class_name("UNet2DConditionModel") is None
    registry.register_model_family("marked_too", _Marked)
    assert registry.family_for_class_name("MarkedTransformer") is None  # two claim it: cannot tell


def test_a_checkpoint_records_its_family_by_run_config_else_class_name(tmp_path, monkeypatch):
    import json

    from fastvideo.training.checkpoint.files import recorded_family

    _register_marked(monkeypatch, "marked")
    ckpt = tmp_path / "run" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    assert recorded_family(ckpt) is None  # nothing says
    (ckpt / "transformer_config.json").write_text(json.dumps({"_class_name": "MarkedTransformer"}))
    assert recorded_family(ckpt) == "marked"  # the transformer config's class
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {"family": "flux"}, "rollout": {}}))
    assert recorded_family(ckpt) == "flux"  # the run's config wins
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {}, "rollout": {}}))
    assert recorded_family(ckpt) == "flux"  # a run from before --model_family: the default
    (tmp_path / "run" / "config.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    assert recorded_family(ckpt) == "marked"  # not a run config: ignored


def test_export_refuses_a_checkpoint_whose_family_nothing_records(tmp_path):
    """No silent FLUX: a checkpoint folder without its run's config.json and without a transformer
    config naming a registered class is refused, naming the folder."""
    from fastvideo.training.export import ExportError, checkpoint_family

    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    with pytest.raises(ExportError, match="cannot tell which model family .*checkpoint-1"):
        checkpoint_family(folder)
    (folder / "config.json").write_text(json.dumps({"_class_name": "FluxTransformer2DModel"}))
    assert checkpoint_family(folder).name == "flux"
