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
