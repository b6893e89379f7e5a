"""Loaded at start-up by every Python whose PYTHONPATH holds this folder (tests/conftest.py puts it
there): with FLUX_GRPO_HCCL_RULES=1, torchrun's children check their collectives against HCCL's
rules (tests/hccl_rules.py). Nothing is imported when the switch is off."""

import os

def _torch_importable() -> bool:
    """Pythons without torch (pip's build environments, a fresh venv) also read this folder."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


if os.environ.get("FLUX_GRPO_HCCL_RULES", "0") == "1" and _torch_importable():
    import importlib.util

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hccl_rules.py")
    _spec = importlib.util.spec_from_file_location("hccl_rules", _path)
    _module = importlib.util.module_from_spec(_spec)
    import sys

    sys.modules["hccl_rules"] = _module
    _spec.loader.exec_module(_module)
    _module.install()
