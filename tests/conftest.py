import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("FASTVIDEO_DEVICE", "cpu")
# HCCL's collective rules (tests/hccl_rules.py) in every distributed test: run_distributed's children
# install them, and torchrun's children through tests/hccl_site/sitecustomize.py on PYTHONPATH.
# FLUX_GRPO_HCCL_RULES=0 turns them off.
os.environ.setdefault("FLUX_GRPO_HCCL_RULES", "1")
HCCL_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hccl_site")
if HCCL_SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), HCCL_SITE) if p)


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory):
    """A tiny random-weight FLUX folder in diffusers layout, built once per test session."""
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    return make_tiny_flux(tmp_path_factory.mktemp("tiny_flux"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_embeddings(tiny_flux_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny model (T5 length 32): videos2caption.json path."""
    from pathlib import Path

    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("tiny_embeddings")
    cfg = PreprocessConfig(model_path=str(tiny_flux_dir), prompt_file=str(root / "assets" / "prompts_tiny.txt"),
                           output_dir=str(out), max_sequence_length=32, batch_size=8, dataloader_num_workers=0)
    return run_preprocess(cfg).json_path


@pytest.fixture(scope="session")
def tiny_rewards(tmp_path_factory):
    """Tiny reward checkpoints (hps_ckpt/, pickscore/, aesthetic/...) in the real layouts, built once."""
    from fastvideo.tools.make_tiny_reward import make_tiny_reward

    return make_tiny_reward(tmp_path_factory.mktemp("tiny_rewards"), seed=0)


@pytest.fixture(scope="session")
def tiny_sd3_dir(tmp_path_factory):
    """A tiny random-weight SD3.5 folder in diffusers layout (make_tiny_sd3), built once per session."""
    from fastvideo.tools.make_tiny_sd3 import make_tiny_sd3

    return make_tiny_sd3(tmp_path_factory.mktemp("tiny_sd3"), seed=0)


@pytest.fixture(scope="session")
def tiny_flux2_dir(tmp_path_factory):
    """A tiny random-weight FLUX.2 [klein] base folder (make_tiny_flux2; the current library line)."""
    from fastvideo.tools.make_tiny_flux2 import make_tiny_flux2

    return make_tiny_flux2(tmp_path_factory.mktemp("tiny_flux2"), seed=0)


def encode_tiny_prompts(model_dir, tmp_path_factory, name: str, seq: int, family: str = "flux"):
    """assets/prompts_tiny.txt encoded with ``model_dir``'s text encoders (length ``seq``) into a fresh
    temporary folder ``name``: its videos2caption.json path."""
    from pathlib import Path

    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    root = Path(__file__).resolve().parents[1]
    cfg = PreprocessConfig(model_path=str(model_dir), prompt_file=str(root / "assets" / "prompts_tiny.txt"),
                           output_dir=str(tmp_path_factory.mktemp(name)), max_sequence_length=seq, batch_size=8,
                           dataloader_num_workers=0, model_family=family)
    return run_preprocess(cfg).json_path


@pytest.fixture(scope="session")
def sd3_sp_embeddings(tiny_sd3_dir, tmp_path_factory):
    """The tiny SD3.5's embeddings of the bundled prompts (16 tokens), for the sequence-parallel runs."""
    return encode_tiny_prompts(tiny_sd3_dir, tmp_path_factory, "sd3_sp", 16, family="sd3")


@pytest.fixture(scope="session")
def flux2_embeddings(tiny_flux2_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny klein (Qwen3 length 48, with the empty prompt)."""
    return encode_tiny_prompts(tiny_flux2_dir, tmp_path_factory, "flux2_embeddings", 48, "flux2")


@pytest.fixture(scope="session")
def tiny_flux2_dev_dir(tmp_path_factory):
    """A tiny random-weight FLUX.2 [dev] folder (make_tiny_flux2 --variant dev; the current library line)."""
    from fastvideo.tools.make_tiny_flux2 import make_tiny_flux2

    return make_tiny_flux2(tmp_path_factory.mktemp("tiny_flux2_dev"), seed=0, variant="dev")


# The tiny dev's Mistral-3 sequence: the pipeline's system message takes 104 of the tiny tokenizer's
# tokens, the bundled prompts at most 40 more.
FLUX2_DEV_SEQ = 144


@pytest.fixture(scope="session")
def flux2_dev_embeddings(tiny_flux2_dev_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny dev (Mistral-3 length 144, with the empty prompt)."""
    return encode_tiny_prompts(tiny_flux2_dev_dir, tmp_path_factory, "flux2_dev_embeddings", FLUX2_DEV_SEQ, "flux2")


@pytest.fixture(scope="session")
def tiny_zimage_dir(tmp_path_factory):
    """A tiny random-weight Z-Image folder (make_tiny_zimage; the current library line)."""
    from fastvideo.tools.make_tiny_zimage import make_tiny_zimage

    return make_tiny_zimage(tmp_path_factory.mktemp("tiny_zimage"), seed=0)


@pytest.fixture(scope="session")
def zimage_embeddings(tiny_zimage_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny Z-Image (Qwen3 length 48, with the empty prompt)."""
    return encode_tiny_prompts(tiny_zimage_dir, tmp_path_factory, "zimage_embeddings", 48, "zimage")


@pytest.fixture(scope="session")
def tiny_qwen_image_dir(tmp_path_factory):
    """A tiny random-weight Qwen-Image folder (make_tiny_qwen_image; the current library line)."""
    from fastvideo.tools.make_tiny_qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(tmp_path_factory.mktemp("tiny_qwen_image"), seed=0)


@pytest.fixture(scope="session")
def qwen_image_embeddings(tiny_qwen_image_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny Qwen-Image (48 tokens after the template, with the negative " ")."""
    return encode_tiny_prompts(tiny_qwen_image_dir, tmp_path_factory, "qwen_image_embeddings", 48, "qwen_image")


def _tiny_wan(tmp_path_factory, name: str, variant: str):
    """make_tiny_wan's folder of ``variant`` (seed 0) in a fresh temporary folder ``name``."""
    from fastvideo.tools.make_tiny_wan import make_tiny_wan

    return make_tiny_wan(tmp_path_factory.mktemp(name), seed=0, variant=variant)


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory):
    """A tiny random-weight Wan2.1-T2V folder (make_tiny_wan; the current library line)."""
    return _tiny_wan(tmp_path_factory, "tiny_wan", "t2v")


@pytest.fixture(scope="session")
def tiny_wan_i2v_dir(tmp_path_factory):
    """A tiny random-weight Wan2.1-I2V folder (make_tiny_wan --variant i2v; the current library line)."""
    return _tiny_wan(tmp_path_factory, "tiny_wan_i2v", "i2v")


@pytest.fixture(scope="session")
def tiny_wan_i2v_a14b_dir(tmp_path_factory):
    """A tiny random-weight Wan2.2-I2V-A14B folder: two 36-channel experts, no image encoder (--variant i2v_a14b)."""
    return _tiny_wan(tmp_path_factory, "tiny_wan_i2v_a14b", "i2v_a14b")


@pytest.fixture(scope="session")
def tiny_wan_ti2v_dir(tmp_path_factory):
    """A tiny random-weight Wan2.2-TI2V-5B folder (make_tiny_wan --variant ti2v; the current library line)."""
    return _tiny_wan(tmp_path_factory, "tiny_wan_ti2v", "ti2v")


@pytest.fixture(scope="session")
def tiny_wan_a14b_dir(tmp_path_factory):
    """A tiny random-weight Wan2.2-T2V-A14B folder: two experts and boundary_ratio (make_tiny_wan --variant a14b)."""
    return _tiny_wan(tmp_path_factory, "tiny_wan_a14b", "a14b")


@pytest.fixture(scope="session")
def wan_embeddings(tiny_wan_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny Wan2.1's umT5 (length 32, with the negative "")."""
    return encode_tiny_prompts(tiny_wan_dir, tmp_path_factory, "wan_embeddings", 32, "wan")


@pytest.fixture(scope="session")
def wan_ti2v_embeddings(tiny_wan_ti2v_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny Wan2.2-TI2V-5B's umT5 (length 32), for text to video."""
    return encode_tiny_prompts(tiny_wan_ti2v_dir, tmp_path_factory, "wan_ti2v_embeddings", 32, "wan")


@pytest.fixture(scope="session")
def tiny_hunyuan_video_dir(tmp_path_factory):
    """A tiny random-weight HunyuanVideo folder (make_tiny_hunyuan_video; both library lines)."""
    from fastvideo.tools.make_tiny_hunyuan_video import make_tiny_hunyuan_video

    return make_tiny_hunyuan_video(tmp_path_factory.mktemp("tiny_hunyuan_video"), seed=0)


@pytest.fixture(scope="session")
def hunyuan_video_embeddings(tiny_hunyuan_video_dir, tmp_path_factory):
    """assets/prompts_tiny.txt encoded with the tiny HunyuanVideo's Llama (40 tokens after the template's
    95; their longest is 38) and CLIP."""
    return encode_tiny_prompts(tiny_hunyuan_video_dir, tmp_path_factory, "hunyuan_video_embeddings", 40,
                               "hunyuan_video")


# FLUX.1-schnell's scheduler_config.json: no dynamic shifting, shift 1.
SCHNELL_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.32.0",
                     "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
                     "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False}


@pytest.fixture(scope="session")
def tiny_schnell_dir(tiny_flux_dir, tmp_path_factory):
    """The tiny FLUX folder with a schnell-shaped transformer (guidance_embeds False, random weights)."""
    import json
    import shutil

    import torch
    from diffusers import FluxTransformer2DModel

    out = tmp_path_factory.mktemp("schnell") / "model"
    shutil.copytree(tiny_flux_dir, out)
    config = json.loads((out / "transformer" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")} | {"guidance_embeds": False}
    torch.manual_seed(0)
    model = FluxTransformer2DModel.from_config(config)
    with torch.no_grad():  # as make_tiny_flux: the zero-initialised output projections get small values
        for name, p in model.named_parameters():
            if torch.count_nonzero(p) == 0 and "norm" not in name:
                p.copy_(torch.randn(p.shape) * 0.02)
    shutil.rmtree(out / "transformer")
    model.save_pretrained(out / "transformer", safe_serialization=True)
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHNELL_SCHEDULER))
    return out


# FLUX_GRPO_TEST_CPU_REPORT=FILE: each test's CPU seconds (this process and the children it reaped:
# forked ranks, torchrun, subprocesses), slowest first. Wall times depend on the machine's load;
# CPU seconds rank the tests the same way on a busy machine as on CI's idle one.
_CPU_REPORT = os.environ.get("FLUX_GRPO_TEST_CPU_REPORT")
_cpu_seconds: dict[str, float] = {}


def _cpu_now() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_collection_modifyitems(config, items):
    """Skip the files tests/line_split.py leaves to the other library line's suite."""
    from pathlib import Path

    from line_split import TESTS, missing, skip_reason

    from fastvideo.library_lines import library_line

    if missing():
        raise pytest.UsageError(f"tests/line_split.py lists files that do not exist: {missing()}")
    line = library_line()
    for item in items:
        path = Path(str(item.fspath))
        reason = skip_reason(path.relative_to(TESTS).as_posix(), line, os.environ) if path.is_relative_to(TESTS) else None
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu_now() if _CPU_REPORT else 0.0
    yield
    if _CPU_REPORT:
        _cpu_seconds[item.nodeid] = _cpu_now() - start


def pytest_sessionfinish(session, exitstatus):
    if _CPU_REPORT and _cpu_seconds:
        rows = sorted(_cpu_seconds.items(), key=lambda kv: -kv[1])
        total = sum(_cpu_seconds.values())
        worker = os.environ.get("PYTEST_XDIST_WORKER")  # one file per xdist worker: FILE.gw0, FILE.gw1 ...
        with open(f"{_CPU_REPORT}.{worker}" if worker else _CPU_REPORT, "w", encoding="utf-8") as f:
            f.write(f"# {len(rows)} tests, {total:.0f} CPU s in all\n")
            f.writelines(f"{sec:8.1f}  {nodeid}\n" for nodeid, sec in rows)


@pytest.fixture(scope="session")
def tiny_kontext_dir(tmp_path_factory):
    """A tiny random-weight FLUX.1 Kontext folder (make_tiny_kontext: the tiny FLUX.1 with
    FluxKontextPipeline's model_index.json)."""
    from fastvideo.tools.make_tiny_kontext import make_tiny_kontext

    return make_tiny_kontext(tmp_path_factory.mktemp("tiny_kontext"), seed=0)


@pytest.fixture(scope="session")
def kontext_embeddings(tiny_kontext_dir, tmp_path_factory):
    """assets/edit/prompts_edit.jsonl (8 instructions with 64x64 source images) encoded with the tiny
    Kontext (T5 length 32, source latents): videos2caption.json path."""
    from pathlib import Path

    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    root = Path(__file__).resolve().parents[1]
    cfg = PreprocessConfig(model_path=str(tiny_kontext_dir), prompt_file=str(root / "assets/edit/prompts_edit.jsonl"),
                           output_dir=str(tmp_path_factory.mktemp("kontext_embeddings")), max_sequence_length=32,
                           batch_size=8, dataloader_num_workers=0, model_family="kontext")
    return run_preprocess(cfg).json_path
