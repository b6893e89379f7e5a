"""RunRecorder: manifest, per-iteration files named by global sample id, rank roles, tensors."""

import json

import numpy as np
import pytest
import torch
from alignment_helpers import Rewards, dist_info, make_cfg, make_traj, record_run
from PIL import Image
from safetensors.torch import load_file

from fastvideo.alignment.compare import compare_runs, load_run
from fastvideo.alignment.recorder import RunRecorder, iteration_dir
from fastvideo.sampling.images import to_uint8


def test_manifest_describes_the_run(tmp_path):
    cfg = make_cfg(tmp_path / "rec", seed=123)
    RunRecorder(cfg, dist_info())
    m = json.loads((tmp_path / "rec" / "manifest.json").read_text())
    assert m["device"]["type"] == "cpu" and m["device"]["name"]
    assert m["world_size"] == 1 and m["seed"] == 123
    assert m["config"]["optim"]["seed"] == 123
    assert m["config"]["output"]["record_dir"] == str(tmp_path / "rec")
    assert m["versions"]["torch"] == torch.__version__
    import diffusers
    import transformers

    assert m["versions"]["diffusers"] == diffusers.__version__
    assert m["versions"]["transformers"] == transformers.__version__
    assert m["git_commit"] is None or len(m["git_commit"]) == 40


def test_only_rank0_writes_manifest_and_metrics(tmp_path):
    cfg = make_cfg(tmp_path)
    rec1 = RunRecorder(cfg, dist_info(rank=1, world_size=2))
    assert not (tmp_path / "manifest.json").exists()
    traj = make_traj(1, [6, 7])
    rec1.record_iteration(1, traj, Rewards(torch.tensor([1.0, 2.0]), {}), torch.tensor([-1.0, 1.0]), {"loss": 0.1})
    folder = iteration_dir(tmp_path, 1)
    assert not (folder / "metrics.json").exists()
    assert sorted(p.name for p in (folder / "images").iterdir()) == ["sample_000006.png", "sample_000007.png"]
    assert (folder / "samples_rank00001.json").is_file()


def test_iteration_files(tmp_path):
    cfg = make_cfg(tmp_path, record_tensors=True)
    rec = RunRecorder(cfg, dist_info())
    traj = make_traj(3, [10, 11, 12, 13])
    total = torch.tensor([0.5, -0.25, 1.5, 2.0])
    raw = {"hpsv2": torch.tensor([0.3, 0.2, 0.1, 0.0]), "compressibility": total * 2}
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    record = {"iteration": 3, "loss": torch.tensor(0.125), "grad_norm": 2.5, "ratio_mean": 1.0}
    folder = rec.record_iteration(3, traj, Rewards(total, raw), adv, record)
    assert folder == tmp_path / "iter_000003"

    samples = json.loads((folder / "samples_rank00000.json").read_text())["samples"]
    assert [s["sample_id"] for s in samples] == [10, 11, 12, 13]
    assert [s["group_id"] for s in samples] == [5, 5, 6, 6]
    assert [s["caption"] for s in samples] == traj.captions
    assert [s["reward"] for s in samples] == total.tolist()
    assert [s["advantage"] for s in samples] == adv.tolist()
    assert [s["rewards"]["hpsv2"] for s in samples] == pytest.approx(raw["hpsv2"].tolist())

    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics == {"iteration": 3, "loss": 0.125, "grad_norm": 2.5, "ratio_mean": 1.0}

    expected = to_uint8(traj.images).numpy()
    for row, sid in enumerate([10, 11, 12, 13]):
        got = np.asarray(Image.open(folder / "images" / f"sample_{sid:06d}.png"))
        np.testing.assert_array_equal(got, expected[row])

    t = load_file(str(folder / "tensors_rank00000.safetensors"))
    for row, sid in enumerate([10, 11, 12, 13]):
        torch.testing.assert_close(t[f"initial_noise/{sid}"], traj.latents[row, 0], rtol=0, atol=0)
    torch.testing.assert_close(t["latents/10"], traj.latents[0], rtol=0, atol=0)
    torch.testing.assert_close(t["log_probs/10"], traj.log_probs[0], rtol=0, atol=0)
    assert "latents/11" not in t
    assert not list(tmp_path.rglob("*.tmp")), "atomic writes left temporary files behind"


def test_world_size_does_not_change_the_record(tmp_path):
    one = record_run(tmp_path / "w1", iterations=2, num_samples=4, world_size=1)
    two = record_run(tmp_path / "w2", iterations=2, num_samples=4, world_size=2)
    for it in (1, 2):
        a, b = load_run(one).iterations[it], load_run(two).iterations[it]
        assert sorted(a.images) == sorted(b.images) == [f"sample_{8 * it + k:06d}.png" for k in range(4)]
        assert {k: v["reward"] for k, v in a.samples.items()} == {k: v["reward"] for k, v in b.samples.items()}
    assert len(list((iteration_dir(two, 1)).glob("samples_rank*.json"))) == 2
    cmp = compare_runs(one, two)
    assert cmp.passed
    assert all(d.psnr == float("inf") for c in cmp.iterations for d in c.images)


def test_needs_a_record_dir(tmp_path):
    cfg = make_cfg(tmp_path)
    cfg.output.record_dir = None
    with pytest.raises(ValueError, match="record_dir"):
        RunRecorder(cfg, dist_info())


def test_clips_are_recorded_as_lossless_animated_pngs(tmp_path):
    """A video family's samples [B, F, 3, H, W]: each an animated PNG of every frame, exact (run
    comparisons read frame 0); F == 1 writes the image's PNG byte for byte."""
    import dataclasses

    from PIL import ImageSequence

    traj = make_traj(1, [6, 7])
    clips = torch.stack([traj.images, traj.images.flip(-1), 1 - traj.images], dim=1)  # 3 frames each
    args = (Rewards(torch.tensor([1.0, 2.0]), {}), torch.tensor([-1.0, 1.0]), {})
    folder = RunRecorder(make_cfg(tmp_path / "a"), dist_info()).record_iteration(
        1, dataclasses.replace(traj, images=clips), *args)
    for row, sid in enumerate([6, 7]):
        with Image.open(folder / "images" / f"sample_{sid:06d}.png") as im:
            frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)]
        expected = to_uint8(clips[row]).numpy()
        assert len(frames) == 3 and all(np.array_equal(f, e) for f, e in zip(frames, expected))
    one = RunRecorder(make_cfg(tmp_path / "b"), dist_info()).record_iteration(
        1, dataclasses.replace(traj, images=traj.images.unsqueeze(1)), *args)
    image = RunRecorder(make_cfg(tmp_path / "c"), dist_info()).record_iteration(1, traj, *args)
    for sid in (6, 7):
        name = f"images/sample_{sid:06d}.png"
        assert (one / name).read_bytes() == (image / name).read_bytes()
