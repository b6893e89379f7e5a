import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("FASTVIDEO_DEVICE", "cpu")


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
