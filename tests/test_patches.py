"""The diffusers patch series (patches/diffusers) and the NPU shell helpers.

The network test downloads diffusers 0.32.0's source distribution once (cached under
~/.cache/flux_grpo/, or $FLUX_GRPO_CACHE), applies the series with scripts/apply_diffusers_patches.sh
(git am), and imports the patched package in subprocesses: without torch_npu it must compute
exactly what the installed stock diffusers computes here; with the stand-in torch_npu
(tests/npu_stub.py) it must take the fused kernels and still agree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
PATCH_DIR = REPO / "patches" / "diffusers"
PATCH_NAME = re.compile(r"^(\d{4})-(bugfix|feature)-([a-z0-9]+(?:_[a-z0-9]+)*)\.patch$")
DIFFUSERS_VERSION = "0.32.0"


def _patches() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch"))


def test_patch_names_and_numbering():
    patches = _patches()
    assert patches, f"no patches in {PATCH_DIR}"
    for index, path in enumerate(patches, start=1):
        match = PATCH_NAME.match(path.name)
        assert match, f"{path.name} is not NNNN-(bugfix|feature)-snake_case_description.patch"
        assert int(match.group(1)) == index, f"{path.name}: expected number {index:04d} (no gaps)"
    assert not [p for p in PATCH_DIR.iterdir() if p.suffix != ".patch"], "only .patch files belong here"


def test_patches_are_git_format_patch_matching_their_names():
    patches = _patches()
    for index, path in enumerate(patches, start=1):
        text = path.read_text()
        assert text.startswith("From "), f"{path.name} is not a git format-patch file"
        kind, description = PATCH_NAME.match(path.name).group(2, 3)
        subject = f"Subject: [PATCH {index}/{len(patches)}] {kind}: {description}\n"
        assert subject in text, f"{path.name}: expected '{subject.strip()}'"
        touched = re.findall(r"^diff --git a/(\S+) b/", text, flags=re.M)
        assert touched and all(f.startswith("src/diffusers/") for f in touched), touched


def test_npu_env_defaults_overrides_and_missing_cann(tmp_path):
    fake_cann = tmp_path / "set_env.sh"
    fake_cann.write_text('export FAKE_CANN=loaded\nexport LD_LIBRARY_PATH="/cann/lib:$LD_LIBRARY_PATH"\n')
    show = (
        "source scripts/npu_env.sh; "
        "echo $TASK_QUEUE_ENABLE $HCCL_BUFFSIZE ${FAKE_CANN:-none} $- $PYTORCH_NPU_ALLOC_CONF"
    )
    ours = ("LD_LIBRARY_PATH", "CANN_SET_ENV", "TASK_QUEUE_ENABLE", "HCCL_BUFFSIZE", "PYTORCH_NPU_ALLOC_CONF")
    env = {k: v for k, v in os.environ.items() if k not in ours}

    def run(**extra):
        return subprocess.run(
            ["bash", "-c", f"set -euo pipefail; {show}"],
            cwd=REPO, env={**env, **extra}, capture_output=True, text=True, check=True,
        )

    loaded = run(HCCL_BUFFSIZE="400", CANN_SET_ENV=str(fake_cann))
    queue, buffsize, cann, flags, alloc = loaded.stdout.split()
    assert (queue, buffsize, cann, alloc) == ("2", "400", "loaded", "expandable_segments:True")
    assert "u" in flags  # the caller's `set -u` survives CANN's script
    missing = run(CANN_SET_ENV=str(tmp_path / "absent.sh"))
    assert missing.stdout.split()[1:3] == ["800", "none"]
    assert "not found" in missing.stderr and "CANN_SET_ENV" in missing.stderr


def test_apply_script_refuses_non_empty_target(tmp_path):
    (tmp_path / "something").write_text("x")
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "apply_diffusers_patches.sh"), "--no-install", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert result.returncode != 0 and "not empty" in result.stderr


# ------------------------------------------------------------------------------ network: git am


def _cached_sdist() -> Path:
    cache = Path(os.environ.get("FLUX_GRPO_CACHE", Path.home() / ".cache" / "flux_grpo"))
    sdist = cache / f"diffusers-{DIFFUSERS_VERSION}.tar.gz"
    if sdist.is_file():
        return sdist
    download = cache / f".download-{os.getpid()}"
    download.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"diffusers=={DIFFUSERS_VERSION}", "-d", str(download)],
            check=True, timeout=300,
        )
        os.replace(download / sdist.name, sdist)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return sdist


TINY = dict(
    patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
    num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)


@torch.no_grad()
def _stock_references() -> dict:
    """Outputs of the installed (stock) diffusers 0.32.0 on fixed inputs."""
    from diffusers import FluxTransformer2DModel
    from diffusers.models.attention_processor import FluxAttnProcessor2_0
    from diffusers.models.embeddings import FluxPosEmbed
    from diffusers.models.normalization import RMSNorm

    torch.manual_seed(0)
    norms = []
    for affine, x_dtype in [(True, torch.float32), (True, torch.bfloat16), (False, torch.float32)]:
        norm = RMSNorm(16, eps=1e-6, elementwise_affine=affine)
        if affine:
            norm.weight.uniform_(0.5, 1.5)
        x = (torch.randn(2, 2, 7, 16) * 3).to(x_dtype)
        norms.append({"affine": affine, "state": norm.state_dict(), "x": x, "y": norm(x)})

    grid, n_text = 64, 512
    img = torch.zeros(grid * grid, 3)
    img[:, 1] = torch.arange(grid).repeat_interleave(grid)
    img[:, 2] = torch.arange(grid).repeat(grid)
    ids = torch.cat([torch.zeros(n_text, 3), img])
    cos, sin = FluxPosEmbed(10000, [16, 56, 56])(ids)

    model = FluxTransformer2DModel(**TINY).eval()
    for name, param in model.named_parameters():
        if ".norm_" in name and name.endswith("weight"):
            param.uniform_(0.5, 1.5)
    h = w = 4
    img_ids = torch.zeros(h * w, 3)
    img_ids[:, 1] = torch.arange(h).repeat_interleave(w)
    img_ids[:, 2] = torch.arange(w).repeat(h)
    inputs = {
        "hidden_states": torch.randn(2, h * w, 16),
        "encoder_hidden_states": torch.randn(2, 8, 32),
        "pooled_projections": torch.randn(2, 32),
        "timestep": torch.tensor([0.3, 0.8]),
        "guidance": torch.tensor([3.5, 3.5]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(8, 3),
    }
    out = model(**inputs).sample

    # One joint FLUX attention in bf16 autocast with fp32 weights: q/k fp32, v bf16.
    attn = model.transformer_blocks[0].attn
    assert isinstance(attn.processor, FluxAttnProcessor2_0)
    attn_in = {
        "hidden_states": torch.randn(2, 16, 32),
        "encoder_hidden_states": torch.randn(2, 8, 32),
        "image_rotary_emb": model.pos_embed(torch.cat([inputs["txt_ids"], img_ids])),
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn_out = attn(**attn_in)
    return {
        "norms": norms, "ids": ids, "cos": cos, "sin": sin, "state": model.state_dict(),
        "inputs": inputs, "out": out, "attn_in": attn_in, "attn_out": list(attn_out),
    }


CHILD = textwrap.dedent(
    """
    import sys
    import torch

    mode, ref_path, patched_src = sys.argv[1:4]
    import diffusers
    from diffusers import FluxTransformer2DModel
    from diffusers.models import attention_processor, normalization
    from diffusers.models.embeddings import FluxPosEmbed
    from diffusers.models.normalization import NpuFusedRMSNorm, RMSNorm

    assert diffusers.__file__.startswith(patched_src), diffusers.__file__
    TINY = {tiny!r}
    ref = torch.load(ref_path, weights_only=True)
    stub = mode == "stub"
    if stub:
        import torch_npu
        assert normalization.torch_npu is torch_npu and attention_processor.torch_npu is torch_npu
        normalization.is_npu_tensor = lambda tensor: True  # CPU tensors stand in for NPU ones
    else:
        assert normalization.torch_npu is None and attention_processor.torch_npu is None
        assert "torch_npu" not in sys.modules
        # "broken": torch_npu installed (metadata present) but failing on import, as without CANN;
        # it must count as unavailable, so nothing imports it and FLUX keeps the plain processor.
        assert not diffusers.utils.is_torch_npu_available()

    def check(name, got, want, atol):
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype)
        diff = (got.float() - want.float()).abs().max().item()
        assert diff <= atol, f"{{name}}: max abs diff {{diff}} > {{atol}}"
        print(f"{{mode}} {{name}}: max abs diff {{diff:.3g}}")

    with torch.no_grad():
        for i, case in enumerate(ref["norms"]):
            norm = NpuFusedRMSNorm(16, eps=1e-6, elementwise_affine=case["affine"])
            norm.load_state_dict(case["state"])
            atol = 0 if not stub else (1e-6 if case["x"].dtype == torch.float32 else 1e-2)
            check(f"rms_norm[{{i}}]", norm(case["x"]), case["y"], atol)

        cos, sin = FluxPosEmbed(10000, [16, 56, 56])(ref["ids"])
        check("flux_pos_embed.cos", cos, ref["cos"], 0)
        check("flux_pos_embed.sin", sin, ref["sin"], 0)

        model = FluxTransformer2DModel(**TINY).eval()
        model.load_state_dict(ref["state"], strict=True)  # same state-dict keys
        attn = model.transformer_blocks[0].attn
        assert all(isinstance(getattr(attn, n), NpuFusedRMSNorm) for n in
                   ("norm_q", "norm_k", "norm_added_q", "norm_added_k"))
        assert isinstance(attn.norm_q, RMSNorm)
        if not stub:
            single = model.single_transformer_blocks[0].attn.processor
            assert type(single) is attention_processor.FluxAttnProcessor2_0, single
        check("flux_transformer", model(**ref["inputs"]).sample, ref["out"], 1e-6 if stub else 0)
        if stub:
            assert torch_npu.calls["npu_rms_norm"] == 6 + 3, dict(torch_npu.calls)

        # diffusers' own NPU processor on the same attention, bf16 autocast (q/k fp32, v bf16)
        attn.set_processor(attention_processor.FluxAttnProcessor2_0_NPU())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attn(**ref["attn_in"])
        for j, (got, want) in enumerate(zip(out, ref["attn_out"])):
            check(f"flux_attention_npu_processor[{{j}}]", got, want, 3e-2 if stub else 0)
        if stub:
            assert torch_npu.calls["npu_fusion_attention"] == 1, dict(torch_npu.calls)

        # All-bf16 attention: the stock NPU processor would call torch_npu even off the NPU (or
        # without torch_npu at all); patched, it matches the plain processor there.
        attn.to(torch.bfloat16)
        bf16_in = {{k: v.to(torch.bfloat16) if torch.is_tensor(v) else v for k, v in ref["attn_in"].items()}}
        npu_out = attn(**bf16_in)
        attn.set_processor(attention_processor.FluxAttnProcessor2_0())
        for j, (got, want) in enumerate(zip(npu_out, attn(**bf16_in))):
            check(f"flux_attention_npu_processor_bf16[{{j}}]", got, want, 3e-2 if stub else 0)
        if stub:
            assert torch_npu.calls["npu_fusion_attention"] == 2, dict(torch_npu.calls)
    print(mode, "ok")
    """
).format(tiny=TINY)


def _run_python(args: list[str], path: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _run_child(mode: str, src: Path, ref_path: Path, stub_dir: Path | None) -> str:
    script = ref_path.parent / "check_patched.py"
    script.write_text(CHILD)
    path = [src] + ([stub_dir] if stub_dir else [])
    result = _run_python([str(script), mode, str(ref_path), str(src)], path, ref_path.parent)
    assert result.returncode == 0, f"{mode} child failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _broken_torch_npu(directory: Path) -> Path:
    """torch_npu 'installed' (metadata present) but failing on import, as without CANN."""
    directory.mkdir()
    (directory / "torch_npu.py").write_text(
        "raise OSError('libhccl.so: cannot open shared object file (stand-in: no CANN here)')\n"
    )
    dist_info = directory / "torch_npu-2.7.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1\n")
    return directory


@pytest.mark.network
def test_series_applies_with_git_am_and_patched_diffusers_behaves(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    sdist = _cached_sdist()
    target = tmp_path / "diffusers"
    subprocess.run(
        ["bash", str(REPO / "scripts" / "apply_diffusers_patches.sh"), "--no-install", str(target)],
        env={**os.environ, "DIFFUSERS_SDIST": str(sdist), "PYTHON": sys.executable},
        check=True, capture_output=True, timeout=120,
    )
    log = subprocess.run(
        ["git", "log", "--format=%s", "v0.32.0..HEAD"], cwd=target, capture_output=True, text=True,
        check=True,
    ).stdout.split("\n")[:-1]
    expected = [": ".join(PATCH_NAME.match(p.name).group(2, 3)) for p in _patches()]
    assert log[::-1] == expected

    ref_path = tmp_path / "stock_reference.pt"
    torch.save(_stock_references(), ref_path)

    # Without torch_npu: bit-identical to the stock release.
    assert "plain ok" in _run_child("plain", target / "src", ref_path, stub_dir=None)

    # torch_npu installed without CANN: stock diffusers fails to import, the patched one works.
    broken = _broken_torch_npu(tmp_path / "broken")
    stock = _run_python(["-c", "import diffusers.models.attention_processor"], [broken], tmp_path)
    assert stock.returncode != 0 and "OSError" in stock.stderr, stock.stderr
    assert "broken ok" in _run_child("broken", target / "src", ref_path, stub_dir=broken)

    # With the stand-in torch_npu importable: fused kernels taken, same results.
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (stub_dir / "torch_npu.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom npu_stub import *  # noqa: F401,F403\n"
    )
    assert "stub ok" in _run_child("stub", target / "src", ref_path, stub_dir=stub_dir)
