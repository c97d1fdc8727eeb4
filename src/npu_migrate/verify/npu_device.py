"""The simulated `npu` device of the smoke host: tensors that say `npu:0` and compute on the CPU.

torch's PrivateUse1 dispatch key is renamed "npu" (what torch_npu does), and an `NpuTensor` wrapper
subclass carries a plain CPU tensor (`elem`) while reporting `device(type='npu', index=0)`. Every aten
op on an NpuTensor reaches `__torch_dispatch__`, which unwraps, runs the CPU kernel and wraps the
result again; the few ops that reach the PrivateUse1 key without an NpuTensor argument (factories
such as `torch.empty(..., device="npu")`, the copies behind `.to("npu")`) get PrivateUse1 kernels
that do the same. So `x.is_npu`, `.npu()`, `.to("npu")`, `Module.npu()`, autograd and the optimizers
work as on a device, and a tensor left on the CPU next to an NPU tensor fails as it does on one.

Every NPU tensor is on `npu:0`, whatever `torch.npu.set_device` chose (that index is kept for the code
that asks for it): torch's autograd engine knows one device of a Python backend. So each process of a
multi-process job sees its tensors on npu:0, and `x.to("npu:1")` stays there.

Autocast on "npu" is accepted but casts nothing (a fallthrough): the AMP API works, dtypes stay.

Needs torch's experimental `_setup_privateuseone_for_python_backend` (added in torch 2.9; tested on
2.13). It can run once per process: PrivateUse1 is renamed for good.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch.utils._pytree import tree_leaves, tree_map

DEVICE_TYPE = "npu"

#: Ops that take tensors from two devices by design: copies across devices, and indexing an NPU
#: tensor with CPU indices (which torch moves to the device, as it does on CUDA).
_CROSS_DEVICE_OPS = frozenset(
    {
        "aten::copy_",
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::_to_copy",
        "aten::index.Tensor",
        "aten::index_put",
        "aten::index_put_",
        "aten::_index_put_impl_",
    }
)

#: Ops that reach the PrivateUse1 key with no NpuTensor among their arguments.
_BACKEND_OPS = (
    "empty_strided",
    "empty.memory_format",
    "_copy_from",
    "_copy_from_and_resize",
    "copy_",
    "_to_copy",
    "_local_scalar_dense",
    "view",
    "as_strided",
    "resize_",
)

# The registrations live as long as their Library objects: kept here for the life of the process.
_LIBRARIES: list[torch.library.Library] = []
_NPU0: torch.device | None = None
_mixing_allowed = 0


class DeviceSetupError(RuntimeError):
    """This interpreter cannot become a simulated NPU host (old torch, PrivateUse1 already taken)."""


class NpuTensor(torch.Tensor):
    """A tensor on a simulated NPU, holding its values in the CPU tensor `elem`."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=_NPU0,
            requires_grad=elem.requires_grad,
        )
        wrapper.elem = elem
        return wrapper

    def __repr__(self, *, tensor_contents=None) -> str:
        # What torch prints for a device tensor: the values, then the device.
        text = repr(self.elem.detach())
        suffix = f", device='{self.device}'"
        if self.requires_grad:
            suffix += ", requires_grad=True"
        return text[:-1] + suffix + ")" if text.endswith(")") else text

    def tolist(self):
        return self.elem.tolist()

    def numpy(self, *, force: bool = False):
        # torch's message for any device tensor: the values must be copied to the host first.
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
            "to host memory first."
        )

    __array__ = numpy

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _is_npu_device(device) -> bool:
    if isinstance(device, str):
        device = torch.device(device)
    return isinstance(device, torch.device) and device.type == DEVICE_TYPE


def _unwrap(value):
    return value.elem if isinstance(value, NpuTensor) else value


def _check_one_device(func, leaves) -> None:
    """An op mixing NPU tensors with CPU tensors fails, as on the device (0-dim CPU tensors are allowed)."""
    if _mixing_allowed or func.name() in _CROSS_DEVICE_OPS:
        return
    for leaf in leaves:
        if type(leaf) is torch.Tensor and leaf.device.type == "cpu" and leaf.dim() > 0:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{_NPU0} and cpu! (when checking arguments for {func.name()}; simulated NPU host)"
            )


@contextlib.contextmanager
def mixed_devices_allowed():
    """Within it NPU and CPU tensors mix freely: for the CPU reference kernels, which build CPU helpers."""
    global _mixing_allowed
    _mixing_allowed += 1
    try:
        yield
    finally:
        _mixing_allowed -= 1


def _run(func, args, kwargs):
    if func.namespace == "c10d":
        return _collective(func, args, kwargs)
    if func is torch.ops.aten.record_stream.default:
        return None  # one CPU runs every op in order: no stream to keep a tensor alive for
    leaves = tree_leaves((args, kwargs))
    on_npu = any(isinstance(leaf, NpuTensor) for leaf in leaves)
    if on_npu:
        _check_one_device(func, leaves)
    if kwargs.get("device") is not None:
        on_npu = _is_npu_device(kwargs["device"])
        if on_npu:
            kwargs = dict(kwargs, device=torch.device("cpu"))
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    # In-place copies return their destination, which must stay the caller's tensor.
    if func is torch.ops.aten.copy_.default:
        return args[0]
    if func is torch.ops.aten._copy_from.default:
        return args[1]
    if on_npu:
        return tree_map(lambda t: NpuTensor(t) if type(t) is torch.Tensor else t, out)
    return out


def _collective(func, args, kwargs):
    """A c10d op on NPU tensors: the group's NPU backend runs it on the CPU tensors behind them."""
    wrappers = {id(leaf.elem): leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, NpuTensor)}
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
    out = func.redispatch(keys, *tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    # Collectives work in place and return their arguments: hand back the caller's NPU tensors.
    return tree_map(lambda t: wrappers.get(id(t), t) if isinstance(t, torch.Tensor) else t, out)


def _backend_kernel(op):
    def kernel(*args, **kwargs):
        return _run(op, args, kwargs)

    return kernel


def npu0() -> torch.device:
    """The simulated device, `npu:0` (only after `install_device`)."""
    if _NPU0 is None:
        raise DeviceSetupError("the simulated npu device is not installed in this process")
    return _NPU0


def require_python_backend() -> None:
    """Fail clearly where torch cannot host a Python PrivateUse1 backend."""
    from torch.utils import backend_registration

    if not hasattr(backend_registration, "_setup_privateuseone_for_python_backend"):
        raise DeviceSetupError(
            f"the simulated NPU host needs torch >= 2.9 (torch.utils.backend_registration."
            f"_setup_privateuseone_for_python_backend); this is torch {torch.__version__}"
        )


def install_device(backend_module: types.ModuleType) -> None:
    """Rename PrivateUse1 to "npu", register `backend_module` as `torch.npu`, and install the kernels."""
    global _NPU0
    if _NPU0 is not None:
        return
    require_python_backend()
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE_TYPE):
        raise DeviceSetupError(f"PrivateUse1 is already the {current!r} backend in this process")
    try:
        _setup_privateuseone_for_python_backend(rename=DEVICE_TYPE, backend_module=backend_module)
    except RuntimeError as exc:  # renamed or registered earlier by something else
        raise DeviceSetupError(f"cannot register the simulated npu device: {exc}") from exc
    _NPU0 = torch.device(DEVICE_TYPE, 0)

    kernels = torch.library.Library("aten", "IMPL")
    for name in _BACKEND_OPS:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        kernels.impl(name, _backend_kernel(op), "PrivateUse1")
    autocast = torch.library.Library("_", "IMPL")
    autocast.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _LIBRARIES.extend((kernels, autocast))
