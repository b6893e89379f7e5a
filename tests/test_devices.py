
import pytest
import torch

from fastvideo import devices


def test_cpu_detected_without_accelerators(monkeypatch):
    monkeypatch.delenv(devices.ENV_DEVICE, raising=False)
    if torch.cuda.is_available() or devices.npu_available():
        pytest.skip("machine has an accelerator")
    assert devices.device_type() == "cpu"
    assert devices.dist_backend() == "gloo"


def test_override_and_bad_override(monkeypatch):
    monkeypatch.setenv(devices.ENV_DEVICE, "cpu")
    assert devices.device_type() == "cpu"
    from fastvideo.errors import UserError

    monkeypatch.setenv(devices.ENV_DEVICE, "tpu")  # each a user error: one line, exit 2 (#39 item 15)
    with pytest.raises(UserError, match="npu, cuda, cpu"):
        devices.device_type()
    if not torch.cuda.is_available():
        monkeypatch.setenv(devices.ENV_DEVICE, "cuda")
        with pytest.raises(UserError, match="is_available"):
            devices.device_type()
    monkeypatch.setenv(devices.ENV_DEVICE, "npu")
    if not devices.npu_available():
        with pytest.raises(UserError, match="env_setup.sh --target npu"):
            devices.device_type()


def test_backends_per_device():
    assert [devices.dist_backend(d) for d in ("npu", "cuda", "cpu")] == ["hccl", "nccl", "gloo"]


def test_single_process_init(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(devices.ENV_DEVICE, "cpu")
    info = devices.init_distributed()
    assert (info.rank, info.local_rank, info.world_size, info.device.type) == (0, 0, 1, "cpu")
    assert info.is_main
    t = torch.tensor([3.0])
    assert devices.all_reduce_mean(t).item() == 3.0


def test_autocast_cpu_bf16_and_fp32_noop():
    a = torch.randn(4, 4)
    with devices.autocast("cpu", torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    with devices.autocast("cpu", torch.float32):
        assert (a @ a).dtype == torch.float32


def test_peak_memory_and_seed():
    assert devices.peak_memory_bytes("cpu") > 10 * 2**20
    devices.seed_everything(3)
    x = torch.rand(3)
    devices.seed_everything(3)
    assert torch.equal(x, torch.rand(3))


def test_side_stream_helpers_are_no_ops_on_cpu():
    assert devices.record_event("cpu") is None
    assert devices.new_stream("cpu") is None
    with devices.on_stream("cpu", None, after=None):
        pass


def test_on_stream_waits_for_the_event_then_switches_stream(monkeypatch):
    """On an accelerator the block is queued on the side stream only after it waits for the event
    (checked with a recording stand-in of torch.cuda / torch.npu's Stream/Event API)."""
    calls = []

    class FakeEvent:
        def record(self):
            calls.append("record")

    class FakeStream:
        def __init__(self, device=None):
            calls.append(("stream", str(device)))

        def wait_event(self, event):
            calls.append(("wait", type(event).__name__))

    class FakeModule:
        Event = FakeEvent
        Stream = FakeStream

        @staticmethod
        def stream(s):
            import contextlib

            @contextlib.contextmanager
            def ctx():
                calls.append("enter")
                yield
                calls.append("exit")

            return ctx()

    monkeypatch.setattr(devices, "_device_module", lambda dtype: FakeModule)
    dev = torch.device("cuda", 3)  # constructible without CUDA; the module is the stand-in
    event = devices.record_event(dev)
    stream = devices.new_stream(dev)
    with devices.on_stream(dev, stream, after=event):
        calls.append("work")
    assert calls == ["record", ("stream", "cuda:3"), ("wait", "FakeEvent"), "enter", "work", "exit"]


@pytest.mark.parametrize("allow", [False, True])
def test_fast_matmul_switches_matmul_and_conv_on_npu(monkeypatch, allow):
    """Without --allow_tf32 HF32 is off for matmuls AND convolutions (torch_npu 2.7.1 defaults the
    convolution switch to True); with it, both are on."""
    import sys

    import npu_stub

    stub = npu_stub.make_module()
    assert stub.npu.matmul.allow_hf32 is False and stub.npu.conv.allow_hf32 is True  # 2.7.1 defaults
    monkeypatch.setitem(sys.modules, "torch_npu", stub)
    monkeypatch.setattr(devices, "_torch_npu", None)
    monkeypatch.setattr(devices, "_torch_npu_checked", False)
    devices.set_fast_matmul("npu", allow)
    assert stub.npu.matmul.allow_hf32 is allow and stub.npu.conv.allow_hf32 is allow


def test_fast_matmul_switches_cuda_tf32_both_ways():
    """The switches are plain flags (no GPU needed); cuDNN's convolution TF32 defaults to on."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        devices.set_fast_matmul(torch.device("cuda", 0), False)
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
        devices.set_fast_matmul("cuda", True)
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("value,ids", [("0", [0]), ("0,1,2,3", [0, 1, 2, 3]), ("2,5,7", [2, 5, 7])])
def test_visible_npus_parsed(value, ids):
    assert devices.parse_visible_npus(value) == ids


@pytest.mark.parametrize("value,match", [
    ("0-15", r"one by one.*ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"),
    ("0, 1;2", "one by one"), ("3,1,2", r"ascending.*1,2,3"), ("0,0", "ascending"), ("", "one by one"),
])
def test_visible_npus_refused(value, match):
    with pytest.raises(ValueError, match=match):
        devices.parse_visible_npus(value)


def test_npu_launch_problems():
    ok = devices.npu_launch_problems(16, 16, ",".join(map(str, range(16))), 16)
    assert ok == []
    assert devices.npu_launch_problems(8, 8, None, 16) == []
    for bad in (3, 5, 6, 7):
        (msg,) = devices.npu_launch_problems(bad, bad, None, 16)
        assert f"world size {bad}" in msg and "all_gather_into_tensor" in msg
    (msg,) = devices.npu_launch_problems(8, 8, "0,1,2,3", 16)
    assert "8 processes on this node but only 4 NPU dies visible" in msg
    (msg,) = devices.npu_launch_problems(4, 4, None, 2)
    assert "only 2 NPU dies visible" in msg
    msgs = devices.npu_launch_problems(6, 6, "0-15", 16)
    assert len(msgs) == 2 and "world size 6" in msgs[0] and "one by one" in msgs[1]


def test_init_distributed_refuses_a_bad_npu_launch(monkeypatch):
    """Checked in init_distributed, before the process group (and so before any model)."""
    import types

    monkeypatch.setattr(devices, "device_type", lambda: "npu")
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(device_count=lambda: 16), raising=False)
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "6")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0-15")
    with pytest.raises(ValueError, match="cannot start on NPU") as err:
        devices.init_distributed()
    assert "world size 6" in str(err.value) and "ASCEND_RT_VISIBLE_DEVICES=0,1,2" in str(err.value)


def test_compile_backend_is_inductor_on_cpu_and_cuda_and_debug_backends_pass_through():
    assert devices.compile_backend("cpu") == "inductor"
    assert devices.compile_backend(torch.device("cuda", 1)) == "inductor"
    assert devices.compile_backend("cpu", "aot_eager") == "aot_eager"
    with pytest.raises(ValueError, match="unknown compile backend 'tvm'"):
        devices.compile_backend("cpu", "tvm")
    with pytest.raises(ValueError, match="inductor generates no NPU code"):
        devices.compile_backend("npu:0", "inductor")


def _stub_npu(monkeypatch):
    import sys

    import npu_stub

    monkeypatch.setitem(sys.modules, "torch_npu", npu_stub.make_module())
    monkeypatch.setattr(devices, "_torch_npu", None)
    monkeypatch.setattr(devices, "_torch_npu_checked", False)


def test_compile_on_npu_without_torchair_names_the_version_that_has_it(monkeypatch):
    import sys

    _stub_npu(monkeypatch)
    monkeypatch.setitem(sys.modules, "torchair", None)  # import torchair -> ImportError
    with pytest.raises(ValueError, match=r"torch_npu 2\.7\.1\+stub has none.*Ascend Extension for PyTorch 7\.2\.0"):
        devices.compile_backend("npu:0")


def test_compile_on_npu_takes_torchairs_backend(monkeypatch):
    import sys
    import types

    _stub_npu(monkeypatch)
    torchair = types.ModuleType("torchair")
    torchair.CompilerConfig = lambda: "config"
    torchair.get_npu_backend = lambda compiler_config=None: ("npu_backend", compiler_config)
    monkeypatch.setitem(sys.modules, "torchair", torchair)
    assert devices.compile_backend("npu:0") == ("npu_backend", "config")
    assert devices.compile_backend("npu:0", "eager") == "eager"


def test_host_buffers_are_plain_and_copies_free_on_the_cpu():
    """Pinned memory and asynchronous copies are for accelerators; on the CPU the noise stays
    where it was drawn (the rollout's noise goes through these: sampling/rollout.py)."""
    buf = devices.host_buffer((2, 3), torch.float32, "cpu")
    assert buf.shape == (2, 3) and not buf.is_pinned()
    assert devices.to_device(buf, torch.device("cpu")) is buf


def test_total_memory_is_the_hosts_ram_on_cpu_and_none_without_the_device():
    import os

    from fastvideo import devices

    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            mem_total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
        assert devices.total_memory_bytes("cpu") == mem_total
    if not devices.cuda_available():
        assert devices.total_memory_bytes("cuda") is None
