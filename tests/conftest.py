import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("FASTVIDEO_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory):
    """A tiny random-weight FLUX folder in diffusers layout, built once per test session."""
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    return make_tiny_flux(tmp_path_factory.mktemp("tiny_flux"), preset="tiny", seed=0)
