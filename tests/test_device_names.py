"""Devices and backends are named only in fastvideo/devices.py (and the NPU op module), in the
package and in bench/."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (ROOT / "fastvideo", ROOT / "bench")
ALLOWED = {ROOT / "fastvideo" / "devices.py", ROOT / "fastvideo" / "models" / "npu_ops.py"}
PATTERN = re.compile(
    r"""["']cuda(:[^"']*)?["']|["']cuda:"""         # "cuda", "cuda:0", f"cuda:{i}"
    r"""|["']npu(:[^"']*)?["']|["']npu:"""          # "npu", "npu:0", f"npu:{i}"
    r"""|\.cuda\(|\.npu\("""                        # x.cuda(), x.npu()
    r"""|["']nccl["']|["']hccl["']|Backend\.(NCCL|HCCL)"""
    r"""|torch_npu|torch\.cuda|torch\.npu|torch\.backends\.(cuda|cudnn)"""
    r"""|from\s+torch(\.backends)?\s+import\s+[^#\n]*\b(cuda|cudnn|npu)\b"""  # from torch import cuda
)


def test_no_device_names_outside_the_device_layer():
    offenders = []
    for folder in SCANNED:
        for path in folder.rglob("*.py"):
            if path in ALLOWED:
                continue
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if PATTERN.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "route these through fastvideo.devices:\n" + "\n".join(offenders)


LEAKS = [
    'device = torch.device("cuda")',
    'device = torch.device("cuda:0")',
    "device = f'cuda:{i}'",
    'device = torch.device("npu:1")',
    "x = x.cuda()",
    "x = x.npu()",
    'dist.init_process_group("hccl")',
    "dist.init_process_group(backend=dist.Backend.NCCL)",
    "import torch_npu",
    "torch.backends.cuda.matmul.allow_tf32 = True",
    "torch.backends.cudnn.benchmark = True",
    "from torch import cuda",
    "from torch import nn, cuda",
    "from torch.backends import cudnn",
    "n = torch.cuda.device_count()",
    "n = torch.npu.device_count()",
]
CLEAN = [
    "device = devices.get_device(local_rank)",
    "accelerator = devices.is_accelerator(device)",
    "from torch import nn",
    'name = "npu_rms_norm"',
]


def test_the_check_catches_a_leak():
    missed = [line for line in LEAKS if not PATTERN.search(line)]
    assert not missed, f"not caught: {missed}"
    flagged = [line for line in CLEAN if PATTERN.search(line)]
    assert not flagged, f"false alarms: {flagged}"
