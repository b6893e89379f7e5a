"""LoRA export: the diffusers LoRA file in the stock FluxPipeline, and the merged transformer folder.

The reference is stock diffusers 0.32 (FluxPipeline.load_lora_weights, its own peft injection and
its own sampling loop), not this project's code: the pipeline with the exported file must produce
the latents the same pipeline produces with the trainer's own adapted model as its transformer.
Tolerance: both run the same fp32 operations in the same order except the LoRA branch, where
diffusers applies B at scale 1 to weights that already include the scale 2 (ours: 2 * (B @ A x));
with the scale a power of two that is exact, and the latents agree to 1e-6 absolute (measured
max difference 0 on CPU). The adapters move the latents by much more than that (asserted).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from helpers import single_process_trainer, to_old_layout, train_args  # noqa: E402
from fastvideo.training.checkpoint import read_weights  # noqa: E402

TOL = 1e-6


@pytest.fixture(scope="module")
def lora_run(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    """One LoRA iteration (lr high enough to move the adapters visibly) -> (trainer, checkpoint)."""
    mp = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("lora_run")
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, use_lora=True, lora_rank=4, lora_alpha=8,
                      learning_rate=5e-2, max_train_steps=1, checkpointing_steps=1, save_images_every=0,
                      use_ema=True, ema_decay=0.5)
    trainer = single_process_trainer(argv, mp)
    trainer.train()
    mp.undo()
    return trainer, out / "checkpoint-1"


def _latents(pipe, dataset) -> torch.Tensor:
    embeds, pooled, _, _ = dataset[0]
    with torch.no_grad():
        return pipe(prompt_embeds=embeds[None], pooled_prompt_embeds=pooled[None], height=32, width=32,
                    num_inference_steps=3, guidance_scale=3.5, output_type="latent",
                    generator=torch.Generator().manual_seed(0)).images


def test_stock_pipeline_with_exported_lora_matches_trainer_model(lora_run, tiny_flux_dir, tmp_path):
    from diffusers import FluxPipeline

    from fastvideo.tools.export import main

    trainer, ckpt = lora_run
    main([str(ckpt), str(tmp_path / "lora"), "--lora"])
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()

    stock = FluxPipeline.from_pretrained(tiny_flux_dir)
    base = _latents(stock, trainer.dataset)
    # weight_name: required offline (HF_HUB_OFFLINE=1), the file name diffusers itself writes
    stock.load_lora_weights(str(tmp_path / "lora"), weight_name="pytorch_lora_weights.safetensors")
    exported = _latents(stock, trainer.dataset)
    ours = _latents(FluxPipeline.from_pretrained(tiny_flux_dir, transformer=trainer.model.eval()), trainer.dataset)
    print(f"max abs latent difference stock+exported vs trainer: {(exported - ours).abs().max().item():.3g}; "
          f"LoRA effect {(ours - base).abs().max().item():.3g}")
    assert (exported - ours).abs().max().item() <= TOL
    assert (ours - base).abs().max().item() > 1e3 * TOL, "the adapters did not change the output: test is vacuous"


def test_the_lora_checkpoint_itself_loads_in_the_stock_pipeline(lora_run, tiny_flux_dir, monkeypatch):
    """FluxPipeline.load_lora_weights(checkpoint-N), no export, no weight_name (as online, where
    diffusers picks the file itself; a local folder needs no network): the trainer's latents. The
    file keeps the adapters as trained and records alpha, which diffusers applies as alpha / rank."""
    import diffusers.loaders.lora_base as lora_base
    from diffusers import FluxPipeline

    trainer, ckpt = lora_run
    monkeypatch.setattr(lora_base, "HF_HUB_OFFLINE", False)
    stock = FluxPipeline.from_pretrained(tiny_flux_dir)
    stock.load_lora_weights(str(ckpt))
    loaded = _latents(stock, trainer.dataset)
    ours = _latents(FluxPipeline.from_pretrained(tiny_flux_dir, transformer=trainer.model.eval()), trainer.dataset)
    assert (loaded - ours).abs().max().item() <= TOL


def test_lora_checkpoint_file_and_older_layout_read_alike(lora_run, tmp_path):
    """The checkpoint's LoRA file read as a diffusers file at scale 1 (--resume_from_lora_checkpoint FILE)
    gives the trained adapters back; a LoRA checkpoint of the older layout (lora.safetensors, peft
    names) reads and exports as the new one."""
    import shutil

    from safetensors.torch import load_file

    from fastvideo.tools.export import main
    from fastvideo.training.lora import from_diffusers, read_lora_file

    _, ckpt = lora_run
    trained = read_weights(ckpt, lora=True)
    entries = load_file(str(ckpt / "pytorch_lora_weights.safetensors"))
    assert {float(v) for k, v in entries.items() if k.endswith(".alpha")} == {8.0}
    again = from_diffusers(read_lora_file(ckpt / "pytorch_lora_weights.safetensors"), scale=2.0)
    assert set(again) == set(trained) and all(torch.equal(again[k], trained[k]) for k in trained)

    old = tmp_path / "run" / "checkpoint-1"
    shutil.copytree(ckpt, old)
    shutil.copy(ckpt.parent / "config.json", old.parent / "config.json")
    to_old_layout(old)
    got = read_weights(old, lora=True)
    assert set(got) == set(trained) and all(torch.equal(got[k], trained[k]) for k in trained)
    main([str(ckpt), str(tmp_path / "new_export"), "--lora"])
    main([str(old), str(tmp_path / "old_export"), "--lora"])
    name = "pytorch_lora_weights.safetensors"
    a, b = load_file(str(tmp_path / "new_export" / name)), load_file(str(tmp_path / "old_export" / name))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_merged_export_equals_adapted_model(lora_run, tiny_flux_dir, tmp_path):
    from diffusers import FluxTransformer2DModel

    from fastvideo.tools.export import main

    trainer, ckpt = lora_run
    main([str(ckpt), str(tmp_path / "merged"), "--merge"])
    merged = FluxTransformer2DModel.from_pretrained(tmp_path / "merged")
    ours = trainer.model.eval()
    torch.manual_seed(0)
    x = torch.randn(1, 4, merged.config.in_channels)
    ctx = torch.randn(1, 8, merged.config.joint_attention_dim)
    kw = dict(pooled_projections=torch.randn(1, merged.config.pooled_projection_dim), timestep=torch.tensor([0.5]),
              img_ids=torch.zeros(4, 3), txt_ids=torch.zeros(8, 3), guidance=torch.tensor([3.5]), return_dict=False)
    with torch.no_grad():
        a = merged(hidden_states=x, encoder_hidden_states=ctx, **kw)[0]
        b = ours(hidden_states=x, encoder_hidden_states=ctx, **kw)[0]
    # Merged W + 2 B A versus W x + 2 B (A x): different rounding, fp32.
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert not any(".lora_" in k for k in merged.state_dict())


def test_lora_checkpoint_refuses_plain_export_and_full_refuses_lora(lora_run, tmp_path, capsys):
    from fastvideo.tools.export import main

    _, ckpt = lora_run
    with pytest.raises(SystemExit) as exc:
        main([str(ckpt), str(tmp_path / "x")])
    assert exc.value.code == 2 and "--lora" in capsys.readouterr().err


def test_exported_file_starts_a_new_run_with_the_same_adapters(lora_run, tiny_flux_dir, tiny_embeddings, tmp_path,
                                                                monkeypatch):
    """--resume_from_lora_checkpoint with a diffusers LoRA file (upstream's meaning): adapters equal."""
    from safetensors.torch import load_file

    from fastvideo.tools.export import main

    _, ckpt = lora_run
    main([str(ckpt), str(tmp_path / "lora"), "--lora"])
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "run", use_lora=True, lora_rank=4, lora_alpha=8,
                      resume_from_lora_checkpoint=tmp_path / "lora")
    trainer = single_process_trainer(argv, monkeypatch)
    saved = read_weights(ckpt, lora=True)
    params = dict(trainer.model.named_parameters())
    assert set(saved) == {k for k, p in params.items() if p.requires_grad}
    for k, v in saved.items():
        assert torch.equal(params[k].detach(), v), k
    assert trainer.iteration == 0


def test_ema_adapters_export(lora_run, tmp_path):
    """--lora --ema writes the adapters' EMA (decay 0.5 after one update: halfway between the
    initial and the trained adapters), in the same format."""
    from safetensors.torch import load_file

    from fastvideo.tools.export import main
    from fastvideo.training.lora import to_diffusers

    _, ckpt = lora_run
    main([str(ckpt), str(tmp_path / "ema"), "--lora", "--ema"])
    got = load_file(str(tmp_path / "ema" / "pytorch_lora_weights.safetensors"))
    expected = to_diffusers(load_file(str(ckpt / "ema.safetensors")), scale=2.0)
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in got)
    trained = to_diffusers(read_weights(ckpt, lora=True), scale=2.0)
    b = next(k for k in got if ".lora_B." in k)
    torch.testing.assert_close(got[b], 0.5 * trained[b])  # lora_B starts at 0: EMA = 0.5 * trained
