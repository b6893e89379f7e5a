"""FLUX.2 [dev] (the flux2 family on a Flux2Pipeline folder) against diffusers' own Flux2Pipeline:
Mistral-3 prompt encoding (system message, chat template, layers 10 / 20 / 30), the guidance
embedding (one pass, no classifier-free guidance), the ODE rollout from the same noise, the real
sizes; bad input. The current library line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "FLUX.2 [dev] (diffusers' Flux2Pipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ = 144  # Mistral-3 tokens: the system message takes 104 of the tiny tokenizer's
STEPS, SCALE = 4, 4.0  # SCALE: Flux2Pipeline's guidance_scale default


@pytest.fixture(scope="module")
def pipe(tiny_flux2_dev_dir):
    from diffusers import Flux2Pipeline

    p = Flux2Pipeline.from_pretrained(tiny_flux2_dev_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def cond(tiny_flux2_dev_dir):
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family()
    return family.encode_prompts(family.load_text_encoders(tiny_flux2_dev_dir), PROMPTS, SEQ)


def test_tiny_folder_has_the_dev_layout(tiny_flux2_dev_dir, pipe):
    from fastvideo.models.registry import family_of_folder, get_model_family

    index = json.loads((tiny_flux2_dev_dir / "model_index.json").read_text())
    assert index["_class_name"] == "Flux2Pipeline" and "is_distilled" not in index
    config = pipe.transformer.config
    assert config.guidance_embeds and list(config.axes_dims_rope) == [4, 4, 4, 4] and config.in_channels == 128
    te = pipe.text_encoder
    assert type(te).__name__ == "Mistral3ForConditionalGeneration" and te.config.text_config.num_hidden_layers == 40
    assert config.joint_attention_dim == 3 * te.config.text_config.hidden_size  # three Mistral layers per token
    assert type(pipe.tokenizer).__name__ == "PixtralProcessor"
    assert family_of_folder(tiny_flux2_dev_dir) == "flux2"
    family = get_model_family("flux2", guidance_scale=SCALE)
    assert family.velocity_passes == 2 and family.variant is None  # klein's rule until a folder says dev
    assert family.check_folder(tiny_flux2_dev_dir) == tiny_flux2_dev_dir
    assert family.variant == "dev" and family.velocity_passes == 1  # the scale goes into the embedding


def test_prompt_encoding_equals_the_pipeline(pipe, cond):
    """Flux2Pipeline.encode_prompt (its system message, the processor's chat template without a
    generation prompt, padded to SEQ, layers 10, 20, 30) bit for bit, the prompts and the empty one."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2 import mistral_text as M

    assert M.SYSTEM_MESSAGE == SYSTEM_MESSAGE
    embeds, text_ids = pipe.encode_prompt(PROMPTS, max_sequence_length=SEQ)
    negative, _ = pipe.encode_prompt("", max_sequence_length=SEQ)
    assert cond["prompt_embeds"].shape == (2, SEQ, pipe.transformer.config.joint_attention_dim)
    torch.testing.assert_close(cond["prompt_embeds"], embeds, rtol=0, atol=0)
    torch.testing.assert_close(cond["neg_prompt_embeds"], negative[0], rtol=0, atol=0)
    assert torch.equal(C.text_ids(SEQ), text_ids[0])
    # the layers matter: klein's (9, 18, 27) on the same encoder give other embeddings
    other, _ = pipe.encode_prompt(PROMPTS, max_sequence_length=SEQ, text_encoder_out_layers=(9, 18, 27))
    assert not torch.allclose(cond["prompt_embeds"], other, atol=1e-3)


def _rollout(family, pipe, cond, seed=3):
    from fastvideo.sampling.plan import ode_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    shift = family.schedule_shift(64, 64, STEPS)
    cfg = RolloutConfig(height=64, width=64, sampling_steps=STEPS, eta=0.0, shift=shift, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = ode_plan(STEPS, shift)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(seed), 1, "cpu",
                   plan=plan), plan


@pytest.mark.parametrize("scale", [SCALE, 2.5])
def test_ode_rollout_equals_the_pipeline(tiny_flux2_dev_dir, pipe, cond, scale):
    """The ODE plan's final tokens equal Flux2Pipeline's (output_type latent) for the same noise at
    its default guidance 4.0 and at 2.5, with the pipeline's size-dependent schedule (compute_empirical_mu):
    one transformer pass per step, the scale in the guidance embedding. Tolerance 1e-5 relative (fp32)."""
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family(guidance_scale=scale)
    family.check_folder(tiny_flux2_dev_dir)
    calls = []
    handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["guidance"]),
                                                        with_kwargs=True)
    try:
        traj, plan = _rollout(family, pipe, cond)
    finally:
        handle.remove()
    assert len(calls) == STEPS and all(g is not None and torch.all(g == scale) and g.shape == (2,) for g in calls)
    gh, gw = traj.layout["grid_h"], traj.layout["grid_w"]
    noise = C.to_grid(traj.latents[:, 0], gh, gw)
    ref = pipe(prompt=PROMPTS, height=64, width=64, num_inference_steps=STEPS, guidance_scale=scale,
               latents=noise.clone(), max_sequence_length=SEQ, output_type="latent").images
    ours = traj.latents[:, -1]  # Flux2Pipeline's latent output: the packed, normalised tokens (klein's unpacks them)
    assert ours.shape == ref.shape == (2, 16, 128)
    assert not torch.allclose(ours, traj.latents[:, 0], atol=1e-1)  # it moved
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"dev, guidance {scale}: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    torch.testing.assert_close(plan.sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
    mean, std = C.latent_statistics(pipe.vae)
    x0 = C.unpatchify(C.to_grid(traj.x0, gh, gw) * std + mean)
    ref_img = pipe.vae.decode(x0, return_dict=False)[0]
    torch.testing.assert_close(traj.images, (ref_img / 2 + 0.5).clamp(0, 1), rtol=0, atol=1e-5)


def test_the_scale_is_the_embedding_not_cfg(tiny_flux2_dev_dir, pipe, cond):
    """One call per velocity whatever the scale, and the scale changes it (through the embedding)."""
    from fastvideo.models.flux2.family import Flux2Family

    layout = Flux2Family().layout(64, 64, pipe.vae, pipe.transformer)
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(1))
    calls = []
    handle = pipe.transformer.register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            v4, v1 = (Flux2Family(guidance_scale=s).velocity(pipe.transformer, x, 0.7, cond, layout) for s in (4.0, 1.0))
    finally:
        handle.remove()
    assert len(calls) == 2 and not torch.allclose(v4, v1, atol=1e-4)


def test_real_dev_sizes():
    """The cost model's FLUX.2 [dev]: the transformer diffusers builds from its config has 32B
    parameters; Mistral-Small-3.1 (the text encoder, built on the meta device from its published
    configuration) 24B."""
    from diffusers import Flux2Transformer2DModel
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    from fastvideo.models.flux2 import flops as F

    with torch.device("meta"):
        model = Flux2Transformer2DModel.from_config(F.reference_config(F.DEV))
        text = {"model_type": "mistral", "vocab_size": 131072, "hidden_size": 5120, "intermediate_size": 32768,
                "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "tie_word_embeddings": False}
        vision = {"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "head_dim": 64, "patch_size": 14, "image_size": 1540}
        te = Mistral3ForConditionalGeneration(Mistral3Config(text_config=text, vision_config=vision,
                                                                 tie_word_embeddings=False))
    n = sum(p.numel() for p in model.parameters())
    n_te = sum(p.numel() for p in te.parameters())
    assert 31.5e9 < n < 32.5e9 and abs(n_te - F.MISTRAL3_PARAMS) < 0.01e9, (n, n_te)
    assert F.DEV.guidance_embeds and F.Flux2Dims.from_config({k: v for k, v in F.reference_config(F.DEV).items()
                                                              if k != "guidance_embeds"}).guidance_embeds


def test_bad_inputs_fail_with_one_line(tiny_flux2_dev_dir, tiny_embeddings, flux2_embeddings, tmp_path, cond):
    """FLUX.1 embeddings for dev (the dataset names the family), klein's Qwen3 embeddings for dev
    (the width check names the encoders), a dev folder without its text encoder or processor."""
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.models.base import EmbeddingDatasetError, EmbeddingShapeError
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family(guidance_scale=SCALE)
    family.check_folder(tiny_flux2_dev_dir)
    with pytest.raises(EmbeddingDatasetError, match=r"written for model family 'flux'.* --model_family flux2"):
        PromptEmbeddingDataset(tiny_embeddings, family=family)
    config = json.loads((tiny_flux2_dev_dir / "transformer" / "config.json").read_text())
    klein = PromptEmbeddingDataset(flux2_embeddings, family=family)  # the same keys: the width tells them apart
    dims = tuple(klein[0][0].shape)
    with pytest.raises(EmbeddingShapeError, match=r"Qwen3-4B.*Mistral-Small-3.1-24B: 15360"):
        family.check_dims(dims, config)
    family.check_dims(tuple(cond["prompt_embeds"].shape[1:]), config, SEQ)
    for part in ("text_encoder", "tokenizer"):
        broken = shutil.copytree(tiny_flux2_dev_dir, tmp_path / part)
        shutil.rmtree(broken / part)
        with pytest.raises(C.Flux2FolderError, match=rf"missing: {part}/\. Put a diffusers-layout FLUX.2"):
            family.check_folder(broken, family.text_components)
        with pytest.raises(C.Flux2FolderError, match=f"{part}/"):
            family.load_text_encoders(broken)


def test_builder_command_line(tmp_path, capsys):
    """--variant dev writes the dev folder (the same weights from the same seed); with --distilled,
    or an unknown variant, one line and exit 2, nothing written."""
    from safetensors.torch import load_file

    from fastvideo.tools.make_tiny_flux2 import main, make_tiny_flux2

    main([str(tmp_path / "dev"), "--variant", "dev"])
    assert capsys.readouterr().out.startswith(f"wrote tiny FLUX.2 [dev] folder to {tmp_path / 'dev'} (")
    name = "text_encoder/model.safetensors"
    mine, again = load_file(tmp_path / "dev" / name), load_file(make_tiny_flux2(tmp_path / "again", variant="dev") / name)
    assert mine.keys() == again.keys() and all(__import__("torch").equal(mine[k], again[k]) for k in mine)
    for argv in (["--variant", "dev", "--distilled"], ["--variant", "pro"]):
        with pytest.raises(SystemExit) as stop:
            main([str(tmp_path / "bad"), *argv])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert stop.value.code == 2 and len(err) == 1 and "--variant" in err[0] and not (tmp_path / "bad").exists()
