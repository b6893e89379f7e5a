"""Fixed-noise evaluation: the same noise per (prompt, image) everywhere, and the same scores at
one rank and at two FSDP ranks."""

import torch

from dist_utils import run_distributed
from fastvideo.eval.core import SampleSettings, batch_grid, evaluate, sample_images
from fastvideo.sampling.randomness import RandomSource
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)

S = SampleSettings(height=32, width=32, steps=3, eta=0.0, shift=3.0,
                   batch_size=2, num_images_per_prompt=2)


def test_eval_noise_is_keyed_on_prompt_and_image_only():
    a, b = RandomSource(3), RandomSource(3)
    x = a.eval_noise("a cat", 1, (4, 8))
    b.initial_noise(5, [0, 1], (4, 8))  # other draws before it change nothing
    assert torch.equal(x, b.eval_noise("a cat", 1, (4, 8)))
    assert not torch.equal(x, a.eval_noise("a cat", 0, (4, 8)))
    assert not torch.equal(x, a.eval_noise("a dog", 1, (4, 8)))
    assert not torch.equal(x, RandomSource(4).eval_noise("a cat", 1, (4, 8)))
    assert not torch.equal(a.eval_noise("a cat", 0, (4, 8), step=0), a.eval_noise("a cat", 0, (4, 8)))


def test_eval_noise_capture_and_replay(tmp_path):
    src = RandomSource(9).capture(tmp_path, rank=0, world_size=1)
    x = src.eval_noise("p", 0, (3,))
    src.flush()
    assert (tmp_path / "randomness_eval.safetensors").is_file()
    assert torch.equal(RandomSource(0).replay(tmp_path).eval_noise("p", 0, (3,)), x)


def test_batch_grid():
    assert batch_grid(5, 2) == [[0, 1], [2, 3], [4]]


def _models(model_dir):
    from fastvideo.models import flux

    return flux.load_transformer(model_dir).eval(), flux.load_vae(model_dir)


def _rewards():
    from fastvideo.rewards import build_reward

    return {"detail": build_reward("detail"), "compressibility": build_reward("compressibility")}


def test_an_image_does_not_depend_on_its_batch_companions(tiny_flux_dir, tiny_embeddings):
    from fastvideo.eval.prompts import load_eval_prompts

    model, vae = _models(tiny_flux_dir)
    prompts = load_eval_prompts(tiny_embeddings, str(tiny_flux_dir), 32, family=FLUX)
    together = sample_images(model, vae, prompts, [(0, 0), (3, 1)], RandomSource(1), S, "cpu", family=FLUX)
    alone = sample_images(model, vae, prompts, [(3, 1)], RandomSource(1), S, "cpu", family=FLUX)
    torch.testing.assert_close(together[1:], alone, rtol=1e-4, atol=1e-4)
    other_seed = sample_images(model, vae, prompts, [(3, 1)], RandomSource(2), S, "cpu", family=FLUX)
    assert (other_seed - alone).abs().max() > 1e-2


def _evaluate_fsdp(info, model_dir, json_path):
    from fastvideo.distributed.fsdp import wrap_model
    from fastvideo.eval.prompts import load_eval_prompts

    model, vae = _models(model_dir)
    model = wrap_model(model, strategy="full", device=info.device)
    prompts = load_eval_prompts(json_path, model_dir, 32, family=FLUX)
    s = SampleSettings(**{**S.__dict__, "batch_size": 3})  # 16 images: 6 batches, rank 1 has a spare round
    r = evaluate(model, vae, prompts, _rewards(), RandomSource(1), s, info.device, grid_prompts=3, family=FLUX)
    return {"scores": r.scores, "grid": r.grid}


def test_two_fsdp_ranks_give_the_one_process_scores(tiny_flux_dir, tiny_embeddings):
    from fastvideo.eval.prompts import load_eval_prompts

    model, vae = _models(tiny_flux_dir)
    prompts = load_eval_prompts(tiny_embeddings, str(tiny_flux_dir), 32, family=FLUX)
    s = SampleSettings(**{**S.__dict__, "batch_size": 3})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run_distributed's ranks: CPU kernels may reduce in another order with more
    try:
        ref = evaluate(model, vae, prompts, _rewards(), RandomSource(1), s, "cpu", grid_prompts=3, family=FLUX)
    finally:
        torch.set_num_threads(threads)
    assert ref.scores["detail"].shape == (8, 2) and ref.grid.shape == (3, 3, 32, 32)
    assert not torch.isnan(ref.scores["detail"]).any()
    out = run_distributed(_evaluate_fsdp, str(tiny_flux_dir), str(tiny_embeddings))
    # The ranks gathered one table: equal to each other bit for bit.
    for name in ("detail", "compressibility"):
        assert torch.equal(out[0]["scores"][name], out[1]["scores"][name]), name
    assert torch.equal(out[0]["grid"], out[1]["grid"])
    # Against one process: the same batches and noise, but an FSDP flat parameter is another buffer
    # (another alignment), and BLAS may round a matmul differently on it (seen: 1 ulp of a detail
    # score on one machine, 0 on another). A wrong batch, prompt or noise moves a score by > 1e-3.
    for name in ("detail", "compressibility"):
        torch.testing.assert_close(out[0]["scores"][name], ref.scores[name], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(out[0]["grid"], ref.grid, rtol=0, atol=1e-5)
    spread = (ref.scores["detail"] - ref.scores["detail"].mean()).abs().max()
    assert spread > 1e-3  # so the tolerance above is far below a wrong image's change
