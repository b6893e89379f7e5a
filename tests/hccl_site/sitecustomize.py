"""Loaded at start-up by every Python whose PYTHONPATH holds this folder (tests/conftest.py puts it
there): with FLUX_GRPO_HCCL_RULES=1, torchrun's children check their collectives against HCCL's
rules (tests/hccl_rules.py). Nothing is imported when the switch is off, and the rules are installed
when the process imports torch, not at start-up: a Python that never imports torch (a launcher's
`python -c` probes, pip) does not pay the ~3 s of importing it."""

import os


def _torch_importable() -> bool:
    """Pythons without torch (pip's build environments, a fresh venv) also read this folder."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _install() -> None:
    import importlib.util
    import sys

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hccl_rules.py")
    _spec = importlib.util.spec_from_file_location("hccl_rules", _path)
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["hccl_rules"] = _module
    _spec.loader.exec_module(_module)
    _module.install()


class _AfterTorch:
    """A meta path finder that runs _install() once ``import torch`` has finished (torch's own loader,
    wrapped for that one module)."""

    def find_spec(self, name, path=None, target=None):
        import importlib.util
        import sys

        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _install()

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("FLUX_GRPO_HCCL_RULES", "0") == "1" and _torch_importable():
    import sys

    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorch())
