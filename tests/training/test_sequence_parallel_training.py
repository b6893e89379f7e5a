"""--sp_size 2 through the trainer on 2 gloo ranks (one sequence group: both ranks hold the same
samples, each half the image tokens) against one rank without sequence parallelism: the tiny
FLUX.1, the tiny SD3.5 and the tiny FLUX.1 Kontext (its source tokens split with the generated ones)
train 3 iterations with the same rollout latents and log-probabilities (the run record's tensors),
the same per-iteration rewards, losses and pre-clip gradient norms (the first optimizer step's
gradient) and the same weights after them, all to 1e-5 relative. A checkpoint written at sp = 2
resumes at sp = 1 and one written at sp = 1 resumes at sp = 2, each continuing as the straight run
does. Bad sizes are refused in one line, exit 2."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from helpers import read_metrics, torchrun, train_args

RTOL = 1e-5
LEARNING_RATE = 1e-3  # helpers.train_args' learning rate
ITERATIONS = 3
COMPARED = ("reward_mean", "grad_norm")
WEIGHTS = "diffusion_pytorch_model.safetensors"
# Continuous image statistics: JPEG compressibility counts bytes, and a 1e-7 difference in an image
# can move it by a whole byte.
REWARDS = "detail:1.0,saturation:0.5"


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _flags(record, **more) -> dict:
    return dict(max_train_steps=ITERATIONS, checkpointing_steps=1, save_images_every=0, record_dir=str(record),
                record_tensors=True, rewards=REWARDS, **more)


def _close(a: float, b: float, what: str) -> None:
    assert abs(a - b) <= RTOL * max(abs(a), abs(b), 1e-6), f"{what}: {a} vs {b}"


def _same_metrics(ma: list[dict], mb: list[dict], iterations) -> None:
    by_a, by_b = {r["iteration"]: r for r in ma}, {r["iteration"]: r for r in mb}
    for it in iterations:
        for key in COMPARED:
            _close(by_a[it][key], by_b[it][key], f"iteration {it} {key}")
        # the rewards' spread is a difference of near-equal rewards: its rounding is 1e-7 of the rewards
        scale = max(abs(by_a[it]["reward_mean"]), by_a[it]["reward_std"])
        assert abs(by_a[it]["reward_std"] - by_b[it]["reward_std"]) <= RTOL * scale, it
        # GRPO's loss sums advantage x exp(log p_new - log p_old) terms whose advantages cancel (near
        # 0); the log-probabilities are sums over every latent element, so the
        # ratio's rounding is ~1e-5 absolute (the log-probabilities are compared to 1e-5 relative)
        assert abs(by_a[it]["loss"] - by_b[it]["loss"]) <= 1e-4, (it, by_a[it]["loss"], by_b[it]["loss"])


def _same_tensors(a, b, what: str, adam_steps: int = 0) -> None:
    """Every tensor of two safetensors files equal to 1e-5 relative in norm.

    After `adam_steps` Adam steps (weights), up to 1 element in 1000 of a tensor (at least 1) is set aside first,
    each no further apart than 2 x lr x adam_steps (the most two Adam runs can move one element
    apart). Why: an element whose gradient is within rounding of 0 (|g| ~ 1e-9 against Adam's
    eps = 1e-8, while its neighbours' are >> eps) steps by lr x g / (|g| + eps), so the ~1e-9
    absolute rounding of a reassociated sum moves that step by a large fraction of lr. Which
    elements fall there depends on the CPU's kernels (the tiny Z-Image's text refiner has one on
    AMD EPYC, none on Xeon). A wrong split of the work changes far more elements than that."""
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta and ta.keys() == tb.keys(), what
    for k in ta:
        diff = (ta[k] - tb[k]).double().flatten()
        if adam_steps:
            diff, set_aside = _set_aside_adam_outliers(diff)
            assert all(float(v) <= 2 * LEARNING_RATE * adam_steps for v in set_aside), (what, k, set_aside)
        err = float(torch.linalg.vector_norm(diff))
        assert err <= RTOL * float(torch.linalg.vector_norm(ta[k].double())) + 1e-30, (what, k, err)


def _set_aside_adam_outliers(diff: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """diff [N] -> (diff with its ceil(N / 1000) largest |elements| zeroed, those |elements|)."""
    count = -(-diff.numel() // 1000)
    top = diff.abs().topk(count)
    return diff.index_fill(0, top.indices, 0.0), top.values


def _runs(tmp_path, argv_for):
    """(one rank, sp = 2 on two ranks): output folders, after 3 iterations each."""
    one, two = tmp_path / "sp1", tmp_path / "sp2"
    _ok(torchrun(argv_for(one, _flags(tmp_path / "rec1")), nproc=1))
    _ok(torchrun(argv_for(two, _flags(tmp_path / "rec2", sp_size=2)), nproc=2))
    return one, two


def _check_parity(tmp_path, one, two) -> None:
    m1, m2 = read_metrics(one), read_metrics(two)
    assert [r["iteration"] for r in m2] == list(range(1, ITERATIONS + 1))
    _same_metrics(m1, m2, range(1, ITERATIONS + 1))
    assert m2[0]["comm/rollout/all_to_all_calls"] > 0  # the attention ran across the sequence group
    for it in range(1, ITERATIONS + 1):
        rec = f"iter_{it:06d}/tensors_rank00000.safetensors"
        _same_tensors(tmp_path / "rec1" / rec, tmp_path / "rec2" / rec, f"iteration {it} rollout")
        assert not (tmp_path / "rec2" / f"iter_{it:06d}" / "tensors_rank00001.safetensors").exists()
    _same_tensors(one / f"checkpoint-{ITERATIONS}" / WEIGHTS, two / f"checkpoint-{ITERATIONS}" / WEIGHTS, "weights",
                  adam_steps=ITERATIONS)


@pytest.mark.slow
def test_flux_sp2_equals_one_rank_and_checkpoints_cross_sp(tiny_flux_dir, tiny_embeddings, tmp_path):
    def argv_for(out, flags):
        return train_args(tiny_embeddings, tiny_flux_dir, out, **flags)

    one, two = _runs(tmp_path, argv_for)
    _check_parity(tmp_path, one, two)
    # sp = 2's checkpoint-2 resumed on one rank, and one rank's resumed at sp = 2: iteration 3 as straight
    for src, nproc, sp, name in ((two, 1, 1, "to_sp1"), (one, 2, 2, "to_sp2")):
        out = tmp_path / name
        _ok(torchrun(argv_for(out, _flags(tmp_path / f"rec_{name}", sp_size=sp,
                                          resume_from_checkpoint=str(src / "checkpoint-2"))), nproc=nproc))
        _same_metrics(read_metrics(src), read_metrics(out), [3])
        _same_tensors(src / "checkpoint-3" / WEIGHTS, out / "checkpoint-3" / WEIGHTS, f"{name} weights", adam_steps=1)


VARIANTS = {
    "lora_kl": dict(use_lora=True, lora_rank=4, lora_alpha=8, kl_coef=0.1),  # the reference: adapters off
    "full_kl_ema": dict(kl_coef=0.1, use_ema=True, ema_decay=0.9),  # the reference: its own frozen copy
    "nft": dict(algorithm="nft", nft_beta=0.5),  # forward-process training, the old policy swapped in
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_flux_sp2_equals_one_rank_with(variant, tiny_flux_dir, tiny_embeddings, tmp_path):
    """LoRA, a KL term (both kinds of reference) with EMA, and NFT keep working at sp = 2: two
    iterations as one rank's, metrics and final weights (or adapters) to 1e-5."""
    flags = dict(VARIANTS[variant], max_train_steps=2, checkpointing_steps=2, save_images_every=0, rewards=REWARDS)
    one, two = tmp_path / "sp1", tmp_path / "sp2"
    _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, one, **flags), nproc=1))
    _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, two, sp_size=2, **flags), nproc=2))
    m1, m2 = read_metrics(one), read_metrics(two)
    _same_metrics(m1, m2, [1, 2])
    if "kl_coef" in flags:
        _close(m1[-1]["kl"], m2[-1]["kl"], "kl")
        assert m2[-1]["kl"] > 0
    # the weights, adapters, EMA and NFT's old policy (the optimizer file's layout follows the world size)
    weights = sorted(p.name for p in (one / "checkpoint-2").glob("*.safetensors") if p.name != "optimizer.safetensors")
    assert weights
    for name in weights:
        _same_tensors(one / "checkpoint-2" / name, two / "checkpoint-2" / name, f"{variant} {name}",
                      adam_steps=2)


@pytest.fixture(scope="module")
def sd3_index(sd3_sp_embeddings):
    return sd3_sp_embeddings


@pytest.mark.slow
def test_sd3_sp2_equals_one_rank(tiny_sd3_dir, sd3_index, tmp_path):
    def argv_for(out, flags):
        return train_args(sd3_index, tiny_sd3_dir, out, model_family="sd3", guidance_scale=4.5, **flags)

    one, two = _runs(tmp_path, argv_for)
    _check_parity(tmp_path, one, two)


@pytest.mark.slow
def test_kontext_sp2_equals_one_rank(tiny_kontext_dir, kontext_embeddings, tmp_path):
    """FLUX.1 Kontext: the 4 generated and 16 source tokens (64 x 64 sources) split together."""
    def argv_for(out, flags):
        return train_args(kontext_embeddings, tiny_kontext_dir, out, model_family="kontext", **flags)

    one, two = _runs(tmp_path, argv_for)
    _check_parity(tmp_path, one, two)


@pytest.mark.parametrize("flags,nproc,needle", [
    (dict(sp_size=2, h=48, w=48), 2, "does not divide the 9 image tokens"),
    (dict(sp_size=4), 4, "does not divide the transformer's 2 attention heads"),
])
def test_bad_sp_sizes_refused_in_one_line(tiny_flux_dir, tiny_embeddings, tmp_path, flags, nproc, needle):
    proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out", **flags), nproc=nproc)
    assert proc.returncode == 1, proc.stderr[-3000:]  # each rank exits 2; torchrun reports a failed worker as 1
    lines = [line for line in proc.stderr.splitlines() if needle in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_sp_size_over_the_world_exits_2(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch, capsys):
    from fastvideo.train_grpo_flux import main

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    code = main(train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out", sp_size=2))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert [line for line in err.splitlines() if "--sp_size 2 does not divide the world size 1" in line], err


@pytest.mark.slow
def test_flux_sp2_compiled_equals_sp2_eager(tiny_flux_dir, tiny_embeddings, tmp_path):
    """--compile (Dynamo's capture, backend "eager" as tests/training/test_compile_training.py) with
    --sp_size 2 on 2 ranks: the blocks holding the sequence-parallel attention (its all-to-alls)
    compile, and 2 iterations equal the uncompiled sp = 2 run's to 1e-5."""
    flags = dict(max_train_steps=2, checkpointing_steps=2, save_images_every=0, rewards=REWARDS, sp_size=2,
                 gradient_checkpointing=True)
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, eager, **flags), nproc=2))
    _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, compiled, compile=True, compile_backend="eager",
                            **flags), nproc=2))
    m1, m2 = read_metrics(eager), read_metrics(compiled)
    assert [r["iteration"] for r in m2] == [1, 2]
    _same_metrics(m1, m2, [1, 2])
    # the all-to-alls Dynamo captured into the blocks' graphs run there, uncounted by comm_count
    assert m1[0]["comm/rollout/all_to_all_calls"] > m2[0].get("comm/rollout/all_to_all_calls", 0)
    _same_tensors(eager / "checkpoint-2" / WEIGHTS, compiled / "checkpoint-2" / WEIGHTS, "weights", adam_steps=2)
