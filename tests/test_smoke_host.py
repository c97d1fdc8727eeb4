"""The simulated Ascend host (`npu_migrate.verify.npu_host`): device, torch.npu / torch_npu surface, hccl, CUDA.

`install()` changes its interpreter for good (PrivateUse1 is renamed "npu"), so every check runs in a
fresh interpreter: one probe script per torch_npu version collects what the host does, and the tests
assert on its answers. The expectations come from the API tables and torch_npu_facts.md, not from the
host's own code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from npu_migrate.program.api import NpuApi
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

NEW, OLD = "2.14.0", "2.1.0.post8"

PROBE = textwrap.dedent(
    r"""
    import json, os, sys, types
    out = {}
    def outcome(fn):
        try:
            value = fn()
        except BaseException as exc:
            return {"raised": type(exc).__name__, "message": str(exc)}
        return {"value": value if isinstance(value, (int, float, str, bool, type(None), list, tuple)) else repr(value)}

    from npu_migrate.verify import npu_host
    # A real torch_npu already imported cannot be replaced: refused, and nothing is installed.
    sys.modules["torch_npu"] = types.ModuleType("torch_npu")
    out["refuses_real"] = outcome(lambda: npu_host.install())
    del sys.modules["torch_npu"]
    out["unknown_version"] = outcome(lambda: npu_host.install("9.9.9"))

    host = npu_host.install(sys.argv[1])
    import torch, torch_npu
    import torch.nn.functional as F
    out["reinstall_same"] = npu_host.install(sys.argv[1]) is host
    out["reinstall_other"] = outcome(lambda: npu_host.install("2.8.0.post5"))
    out["version"] = torch_npu.__version__
    out["npu_public"] = sorted(n for n in dir(torch.npu) if not n.startswith("_"))
    out["amp_public"] = sorted(n for n in dir(torch.npu.amp) if not n.startswith("_"))
    out["ops_public"] = sorted(n for n in dir(torch_npu) if n.startswith("npu_"))
    out["torch_npu_npu_is_torch_npu"] = torch_npu.npu is torch.npu

    out["is_available"] = torch.npu.is_available()
    out["device_count"] = torch.npu.device_count()
    out["capability"] = outcome(lambda: torch.npu.get_device_capability())
    os.environ["TORCH_NPU_DEVICE_CAPABILITY"] = "8.0"
    out["capability_env"] = outcome(lambda: torch.npu.get_device_capability(0))
    del os.environ["TORCH_NPU_DEVICE_CAPABILITY"]
    props = torch.npu.get_device_properties(0)
    out["props"] = {k: getattr(props, k) for k in ("name", "total_memory", "cube_core_num", "vector_core_num", "L2_cache_size")}
    out["props_missing"] = [k for k in ("major", "minor", "multi_processor_count") if not hasattr(props, k)]
    out["bf16"] = torch.npu.is_bf16_supported()
    out["set_device_bad"] = outcome(lambda: torch.npu.set_device(3))
    out["memory_peak"] = torch.npu.memory_stats()["allocated_bytes.all.peak"]
    out["max_allocated"] = torch.npu.max_memory_allocated()
    torch.npu.matmul.allow_hf32 = True
    out["hf32"] = [torch.npu.matmul.allow_hf32, torch.npu.conv.allow_hf32]
    def set_hf32_int():
        torch.npu.conv.allow_hf32 = 1
    out["hf32_int"] = outcome(set_hf32_int)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        e = torch.npu.Event(enable_timing=True); e.record(); e.synchronize()
    out["stream_ok"] = torch.npu.current_stream() is not s and torch.npu.default_stream() is torch.npu.current_stream()
    out["not_modelled"] = outcome(lambda: torch.npu.set_option({}))
    out["absent"] = outcome(lambda: torch.npu.this_is_not_torch_npu)
    out["graph"] = outcome(lambda: torch.npu.NPUGraph())
    out["transfer_to_npu"] = outcome(lambda: __import__("torch_npu.contrib.transfer_to_npu"))

    # CUDA fails as on the CPU build an Ascend host has.
    out["cuda_available"] = torch.cuda.is_available()
    out["cuda_version"] = torch.version.cuda
    out["cuda_capability"] = outcome(lambda: torch.cuda.get_device_capability())
    out["cuda_tensor"] = outcome(lambda: torch.zeros(1, device="cuda"))
    out["cuda_method"] = outcome(lambda: torch.ones(1).cuda())

    # The device.
    x = torch.randn(3, 4, device="npu")
    out["device"] = [str(x.device), x.is_npu, str(torch.ones(2).npu().device), str(torch.ones(2).to("npu:0").device)]
    out["mixed"] = outcome(lambda: x + torch.ones(3, 4))
    out["numpy"] = outcome(lambda: x.numpy())
    out["repr"] = repr(torch.tensor([1.0, 2.0], device="npu"))

    # Fused ops: the CPU reference on NPU tensors, with autograd; CPU tensors and bad shapes rejected.
    torch.manual_seed(0)
    h = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    from npu_migrate.verify import reference
    y_ref = reference.npu_rms_norm(h, w)[0]
    hn, wn = h.detach().npu().requires_grad_(), w.detach().npu().requires_grad_()
    y = torch_npu.npu_rms_norm(hn, wn, epsilon=1e-6)[0]
    y.sum().backward()
    y_ref.sum().backward()
    out["rms_equal"] = torch.equal(y.cpu(), y_ref.detach()) and str(y.device) == "npu:0"
    out["rms_grad_equal"] = torch.allclose(hn.grad.cpu(), h.grad) and torch.allclose(wn.grad.cpu(), w.grad)
    out["rms_cpu_tensors"] = outcome(lambda: torch_npu.npu_rms_norm(h, w))
    out["swiglu_odd"] = outcome(lambda: torch_npu.npu_swiglu(torch.randn(2, 5, device="npu")))
    q = torch.randn(1, 2, 4, 8, device="npu"); cos = torch.randn(1, 1, 4, 8, device="npu")
    out["rotary_mode"] = outcome(lambda: tuple(torch_npu.npu_rotary_mul(q, cos, cos, rotary_mode="half").shape))
    out["fused_calls"] = dict(host.fused_calls)

    # A tiny model of our own: one AdamW step on "npu" equals the same step on the CPU.
    def step(device):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
        model = model.npu() if device == "npu" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler(device, enabled=device == "npu")
        x = torch.randn(5, 6).to(device); t = torch.randint(0, 3, (5,)).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "npu"):
            loss = F.cross_entropy(model(x), t)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
        return [p.detach().cpu() for p in model.parameters()], {str(p.device) for p in model.parameters()}
    cpu_params, _ = step("cpu")
    npu_params, devices = step("npu")
    out["train_devices"] = sorted(devices)
    out["train_equal"] = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(cpu_params, npu_params))

    # Checkpoints: saved on the NPU and loaded back there; a CPU checkpoint mapped onto the NPU.
    import io
    buf = io.BytesIO(); torch.save({"w": torch.arange(3.0, device="npu")}, buf); buf.seek(0)
    loaded = torch.load(buf)
    out["ckpt_npu"] = [str(loaded["w"].device), loaded["w"].tolist()]
    buf = io.BytesIO(); torch.save({"w": torch.arange(3.0), "n": 3}, buf); buf.seek(0)
    out["ckpt_map"] = str(torch.load(buf, map_location="npu")["w"].device)
    buf.seek(0)
    out["ckpt_cpu"] = str(torch.load(buf)["w"].device)

    # hccl: a one-process group, collectives on NPU tensors, a DDP step.
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("hccl", world_size=1, rank=0)
    t = torch.ones(3, device="npu") * 2
    dist.all_reduce(t); dist.broadcast(t, 0); dist.barrier()
    gathered = [torch.zeros(3, device="npu")]; dist.all_gather(gathered, t)
    out["hccl"] = [dist.get_backend(), t.tolist(), str(gathered[0].device), torch.distributed.is_hccl_available()]
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2).npu(), device_ids=[0])
    net(torch.randn(4, 3, device="npu")).sum().backward()
    out["ddp_grad"] = str(net.module.weight.grad.device)
    out["hccl_cpu_tensor"] = outcome(lambda: dist.all_reduce(torch.ones(2)))
    dist.destroy_process_group()
    print("PROBE" + json.dumps(out))
    """
)


def _probe(version: str, port: int) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    env.pop("TORCH_NPU_DEVICE_CAPABILITY", None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, version, str(port)], capture_output=True, text=True, env=env, timeout=600
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("PROBE") :])


@pytest.fixture(scope="module")
def new() -> dict:
    return _probe(NEW, 29611)


@pytest.fixture(scope="module")
def old() -> dict:
    return _probe(OLD, 29612)


@pytest.mark.parametrize("version", [NEW, OLD])
def test_surface_is_the_api_table(version, new, old):
    probe, api = {NEW: new, OLD: old}[version], NpuApi(version)
    assert probe["version"] == version
    assert probe["npu_public"] == sorted(api.npu_names)
    assert probe["amp_public"] == sorted(api.npu_amp)
    assert probe["ops_public"] == sorted(api.fused_ops)
    assert probe["torch_npu_npu_is_torch_npu"]


def test_names_an_older_torch_npu_lacks_do_not_exist(new, old):
    assert "NPUGraph" not in NpuApi(OLD).npu_names and "NPUGraph" in NpuApi(NEW).npu_names
    assert old["graph"]["raised"] == "AttributeError" and "2.1.0.post8" in old["graph"]["message"]
    # In 2.14 it exists but the host does not simulate graphs: "not modelled", not a crash of the program.
    assert new["graph"]["raised"] == "NotModelledError"
    # torch_npu 2.1.0.post8's npu_rotary_mul takes (self, r1, r2) only (facts §1.4).
    assert new["rotary_mode"] == {"value": [1, 2, 4, 8]}
    assert old["rotary_mode"]["raised"] == "TypeError" and "rotary_mode" in old["rotary_mode"]["message"]


def test_documented_behaviours(new, old):
    assert new["is_available"] is True and new["device_count"] == 1 and new["bf16"] is True
    assert new["capability"] == {"value": None}
    # TORCH_NPU_DEVICE_CAPABILITY is read by torch_npu >= 2.13 only (facts §0.9).
    assert new["capability_env"] == {"value": [8, 0]}
    assert old["capability_env"] == {"value": None}
    assert new["props"]["name"].startswith("Ascend910B") and new["props"]["total_memory"] > 0
    assert new["props"]["cube_core_num"] > 0 and new["props"]["vector_core_num"] > 0
    assert new["props_missing"] == ["major", "minor", "multi_processor_count"]
    assert new["set_device_bad"]["raised"] == "RuntimeError"
    assert new["memory_peak"] == 0 and new["max_allocated"] == 0
    assert new["hf32"] == [True, True]
    assert new["hf32_int"]["raised"] == "TypeError"
    assert new["stream_ok"] is True


def test_not_modelled_and_absent_names_fail_distinctly(new):
    assert new["not_modelled"]["raised"] == "NotModelledError"
    assert "torch.npu.set_option" in new["not_modelled"]["message"]
    assert issubclass(reference.NotModelledError, Exception) and not issubclass(
        reference.NotModelledError, AttributeError
    )
    assert new["absent"]["raised"] == "AttributeError"
    assert new["transfer_to_npu"]["raised"] == "NotModelledError"


def test_cuda_fails_as_on_a_cpu_build(new):
    assert new["cuda_available"] is False and new["cuda_version"] is None
    for key in ("cuda_capability", "cuda_tensor", "cuda_method"):
        assert new[key] == {"raised": "AssertionError", "message": "Torch not compiled with CUDA enabled"}, key


def test_device_tensors(new):
    assert new["device"] == ["npu:0", True, "npu:0", "npu:0"]
    assert new["mixed"]["raised"] == "RuntimeError" and "same device" in new["mixed"]["message"]
    assert new["numpy"]["raised"] == "TypeError" and "Tensor.cpu()" in new["numpy"]["message"]
    assert new["repr"] == "tensor([1., 2.], device='npu:0')"


def test_fused_ops_run_the_reference_on_npu_tensors(new):
    assert new["rms_equal"] and new["rms_grad_equal"]
    assert new["rms_cpu_tensors"]["raised"] == "RuntimeError" and "'CPU' backend" in new["rms_cpu_tensors"]["message"]
    assert new["swiglu_odd"]["raised"] == "NpuOpError"
    assert new["fused_calls"]["npu_rms_norm"] == 1 and new["fused_calls"]["npu_rotary_mul"] == 1


def test_a_small_model_trains_one_step_on_npu(new):
    assert new["train_devices"] == ["npu:0"]
    assert new["train_equal"]


def test_checkpoints(new):
    assert new["ckpt_npu"] == ["npu:0", [0.0, 1.0, 2.0]]
    assert new["ckpt_map"] == "npu:0" and new["ckpt_cpu"] == "cpu"


def test_hccl_process_group_and_ddp(new):
    assert new["hccl"] == ["hccl", [2.0, 2.0, 2.0], "npu:0", True]
    assert new["ddp_grad"] == "npu:0"
    assert new["hccl_cpu_tensor"]["raised"] == "RuntimeError"


def test_install_refuses_what_it_cannot_simulate(new):
    assert new["refuses_real"]["raised"] == "HostError" and "real torch_npu" in new["refuses_real"]["message"]
    assert new["unknown_version"]["raised"] == "HostError"
    assert new["reinstall_same"] is True
    assert new["reinstall_other"]["raised"] == "HostError"
