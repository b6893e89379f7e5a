"""`import fastvideo` (and its main modules) must work without the optional extras."""

import subprocess
import sys

BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'wandb', 'decord', 'av', 'hpsv2', 'torch_npu', 'peft'}:
            raise ImportError('blocked optional package: ' + name)
        return None
sys.meta_path.insert(0, _Block())
"""


def test_import_without_optional_packages():
    code = BLOCK + """
import fastvideo, fastvideo.devices, fastvideo.models.flux, fastvideo.utils
import fastvideo.config, fastvideo.training.lora, fastvideo.grpo.kl, fastvideo.training.kl_reference
import fastvideo.video_io, fastvideo.sampling.images, fastvideo.eval.report, fastvideo.eval.grid
from fastvideo import devices
assert devices.import_torch_npu() is None
assert devices.device_type() in ('cpu', 'cuda')
for name in ['wandb', 'decord', 'av', 'hpsv2', 'torch_npu', 'peft']:
    assert name not in sys.modules, name
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_require_names_the_extra():
    import pytest

    from fastvideo.utils import MissingExtraError, require

    with pytest.raises(MissingExtraError, match=r"flux-grpo\[wandb\]"):
        require("definitely_not_a_module_xyz", "wandb", "wandb logging")
