"""Devices and backends are named only in fastvideo/platform.py (and the NPU op module)."""

import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fastvideo"
ALLOWED = {PKG / "platform.py", PKG / "models" / "npu_ops.py"}
PATTERN = re.compile(r"""["']cuda["']|\.cuda\(|["']nccl["']|["']hccl["']|["']npu["']|torch_npu|torch\.cuda|torch\.npu""")


def test_no_device_names_outside_platform():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path in ALLOWED:
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if PATTERN.search(line):
                offenders.append(f"{path.relative_to(PKG.parent)}:{lineno}: {line.strip()}")
    assert not offenders, "route these through fastvideo.platform:\n" + "\n".join(offenders)


def test_the_check_catches_a_leak(tmp_path):
    assert PATTERN.search('device = torch.device("cuda")')
    assert PATTERN.search("x = x.cuda()")
    assert PATTERN.search('dist.init_process_group("hccl")')
    assert PATTERN.search("import torch_npu")
    assert not PATTERN.search("device = platform.get_device(local_rank)")
