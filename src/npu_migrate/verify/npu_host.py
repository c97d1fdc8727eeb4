"""`install()`: turn this interpreter into a simulated Ascend NPU host, before the user's code imports.

What an Ascend host looks like to a PyTorch program, built on a CPU build (or a hidden CUDA build) of
torch, with no torch_npu, CANN or device:

* a device "npu" (`npu_device`): `torch.randn(2, device="npu")`, `.npu()`, `Module.npu()`,
  `x.is_npu`, autograd, optimizers, `torch.autocast("npu")`, `torch.amp.GradScaler("npu")`, and
  checkpoints (`npu_serialization`);
* `torch.npu` and a `torch_npu` package whose names are exactly one torch_npu version's, from the
  project's API tables (`npu_surface`), with the documented behaviours (`npu_runtime`) and the fused
  ops bound to the CPU reference (`reference`), which rejects what the device rejects;
* `torch.distributed` with the "hccl" backend: gloo runs the collectives on the CPU tensors behind the
  NPU tensors, so `init_process_group("hccl", ...)`, the collectives and DDP work (one process, or
  several on one machine);
* child interpreters started with the "spawn" method (`torch.multiprocessing.spawn`, DataLoader
  workers under spawn) become the same host before they unpickle their work;
* CUDA failing as on the CPU build of torch an Ascend host has: `torch.cuda.is_available()` is False,
  `torch.version.cuda` is None, and anything that initialises CUDA raises
  `AssertionError: Torch not compiled with CUDA enabled`. On a CUDA build the GPUs are hidden too:
  `CUDA_VISIBLE_DEVICES=""` is set, and `install()` refuses to run once CUDA is initialised.

Install it once, first thing, in a fresh interpreter (it cannot be undone):

    from npu_migrate.verify import npu_host
    host = npu_host.install(torch_npu_version="2.1.0.post8")
    import my_migrated_program   # sees torch_npu 2.1.0.post8 on one NPU

`npu-migrate verify --smoke` runs a program this way (`smoke`).
"""

from __future__ import annotations

import collections
import os
import sys
from dataclasses import dataclass

# The worker sets these before torch is imported; set here too for callers that import torch later.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # torch would import a real torch_npu

import torch  # noqa: E402

from npu_migrate.program.api import NpuApi, UnknownVersionError, available_versions  # noqa: E402
from npu_migrate.verify import npu_device, npu_runtime, npu_serialization, npu_surface  # noqa: E402

NOT_COMPILED = "Torch not compiled with CUDA enabled"
CAPABILITY_ENV_SINCE = "2.13.0"


class HostError(RuntimeError):
    """This interpreter cannot become a simulated NPU host; the message says why and what to do."""


@dataclass(frozen=True)
class Host:
    torch_npu_version: str
    device_count: int
    #: Calls of each fused op (`torch_npu.npu_*`) so far.
    fused_calls: collections.Counter


_HOST: Host | None = None


def installed() -> Host | None:
    return _HOST


def install(torch_npu_version: str | None = None, device_count: int = 1) -> Host:
    """Make this process a simulated Ascend host with `torch_npu_version` (default: the tables' default).

    Raises HostError where it cannot: torch too old, a real torch_npu already imported, CUDA already
    initialised, or a host of another version or size installed earlier in this process.
    """
    global _HOST
    try:
        api = NpuApi(torch_npu_version)
    except UnknownVersionError as exc:
        raise HostError(str(exc)) from None
    if _HOST is not None:
        if (_HOST.torch_npu_version, _HOST.device_count) != (api.version, device_count):
            raise HostError(
                f"this process is already a simulated host with torch_npu {_HOST.torch_npu_version} "
                f"and {_HOST.device_count} device(s): start a fresh interpreter for another"
            )
        return _HOST
    _refuse_real_torch_npu()
    hide_cuda()
    rt = npu_runtime.Runtime(device_count, capability_from_env=_at_least(api.version, CAPABILITY_ENV_SINCE))
    modules = npu_surface.build_modules(api, rt)
    try:
        npu_device.install_device(modules["torch_npu.npu"])
    except npu_device.DeviceSetupError as exc:
        raise HostError(str(exc)) from None
    sys.modules.update(modules)
    sys.meta_path.insert(0, npu_surface.UnmodelledFinder(api.version))
    npu_serialization.install()
    _register_hccl()
    _spawn_children_as_hosts(api.version, device_count)
    _HOST = Host(api.version, device_count, modules["torch_npu"]._npu_migrate_calls)
    return _HOST


def _at_least(version: str, floor: str) -> bool:
    order = available_versions()
    return order.index(version) >= order.index(floor)


def _refuse_real_torch_npu() -> None:
    """A real torch_npu that is importable never loads: the stand-in sits in sys.modules and a finder
    claims its submodules. One already imported has taken the device, and cannot be replaced."""
    real = sys.modules.get("torch_npu")
    if real is not None and not hasattr(real, "_npu_migrate_calls"):
        raise HostError(
            "a real torch_npu is already imported in this process: the simulated NPU host cannot replace it "
            "(run in an environment without torch_npu, or before anything imports it)"
        )


def _not_compiled(*args, **kwargs):
    raise AssertionError(NOT_COMPILED)


def hide_cuda() -> None:
    """CUDA as on a CPU build of torch; on a CUDA build the GPUs are hidden from the driver as well."""
    if torch.backends.cuda.is_built():
        if torch.cuda.is_initialized():
            raise HostError(
                "CUDA was initialised in this process before the simulated NPU host was installed: "
                "install it first thing in a fresh interpreter"
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    # torch.cuda's functions initialise CUDA through `_lazy_init`, and so does torch's C++ code when a
    # tensor is made on "cuda": a CPU build raises this very AssertionError there.
    torch.cuda._lazy_init = _not_compiled
    torch.cuda.is_available = lambda: False
    torch.cuda.device_count = lambda: 0
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: False
    torch.version.cuda = None
    torch.backends.cuda.is_built = lambda: False
    torch.backends.cudnn.is_available = lambda: False


def _spawn_children_as_hosts(version: str, device_count: int) -> None:
    """A spawned child is a fresh interpreter: its command line installs the host before anything else."""
    import multiprocessing.spawn

    import npu_migrate

    command_line = multiprocessing.spawn.get_command_line
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(npu_migrate.__file__)))
    setup = (
        f"import sys; sys.path.insert(0, {package_parent!r}); from npu_migrate.verify import npu_host; "
        f"npu_host.install({version!r}, device_count={device_count}); "
    )

    def host_command_line(**kwds):
        line = command_line(**kwds)
        if "-c" in line:
            index = line.index("-c") + 1
            line[index] = setup + line[index]
        return line

    multiprocessing.spawn.get_command_line = host_command_line


def _register_hccl() -> None:
    """The "hccl" backend on the NPU: gloo over the CPU tensors behind NPU tensors (`npu_device`)."""
    import torch.distributed as dist

    if not dist.is_available():
        return

    def create_hccl(options, backend_options):
        from torch.distributed import ProcessGroupGloo

        return ProcessGroupGloo(options.store, options.group_rank, options.group_size, options.timeout)

    if "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", create_hccl, extended_api=True, devices=["npu"])
    # torch_npu's distributed patch adds this to torch.distributed.
    dist.is_hccl_available = lambda: "hccl" in dist.Backend.backend_list
