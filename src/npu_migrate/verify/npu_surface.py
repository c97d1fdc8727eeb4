"""The stand-in `torch.npu` and `torch_npu` modules, their names taken from one torch_npu version's API table.

`torch.npu`'s public names are exactly that version's `torch.npu.__all__` plus its public attributes
(`transforms/data/torch_npu_api.toml`, through `NpuApi`), `torch.npu.amp`'s its `amp.__all__`, and
`torch_npu`'s fused ops its op schemas. For each name there are three cases:

* modelled (`npu_runtime`, the CPU reference of the fused ops): it works;
* in the table but not modelled: using it (calling it, reading an attribute of it, testing it)
  raises `NotModelledError` naming it, so a smoke failure reads "not modelled", never "your code
  crashed";
* not in the table: AttributeError, as on a host with that torch_npu, which is what catches a
  rewrite to an API an older torch_npu lacks.

`torch_npu`'s other names are not in the tables, so whether they exist is unknown: they are not
modelled, except `torch_npu.npu` (= `torch.npu`), `torch_npu.npu.amp`, `torch_npu.npu.mstx`,
`torch_npu.distributed` and `torch_npu.optim` (the fused optimizers, `npu_optim`). `import
torch_npu.profiler` (any submodule) succeeds and the first name read from it raises NotModelledError,
so `from torch_npu.contrib import transfer_to_npu` fails at once.
"""

from __future__ import annotations

import collections
import functools
import importlib.abc
import importlib.machinery
import inspect
import re
import sys
import types

import torch

from npu_migrate.program.api import NpuApi, load_table
from npu_migrate.verify import npu_device, npu_optim, npu_runtime, reference
from npu_migrate.verify.reference import NotModelledError


def not_modelled(qualname: str, version: str) -> NotModelledError:
    return NotModelledError(
        f"{qualname} is not modelled by the simulated NPU host (torch_npu {version}; npu-migrate verify --smoke): "
        "check this use on an Ascend device"
    )


class Unmodelled:
    """A name the chosen torch_npu has and the host does not simulate: any use raises NotModelledError."""

    def __init__(self, qualname: str, version: str) -> None:
        self._error = functools.partial(not_modelled, qualname, version)
        self._qualname = qualname

    def __repr__(self) -> str:
        return f"<{self._qualname}: not modelled by the simulated NPU host>"

    def __getattr__(self, name: str):
        if name.startswith("__"):  # introspection (copy, inspect, pickle) probes dunders: not a use
            raise AttributeError(name)
        raise self._error()

    def __call__(self, *args, **kwargs):
        raise self._error()

    def __bool__(self) -> bool:
        raise self._error()

    def __iter__(self):
        raise self._error()

    def __getitem__(self, key):
        raise self._error()

    def __enter__(self):
        raise self._error()

    def __exit__(self, *exc):
        raise self._error()

    def __mro_entries__(self, bases):
        raise self._error()


class _UnmodelledClass(type):
    """The metaclass of a stand-in class: reading an attribute of the class itself (a classmethod, a
    constant) is a use, and raises as `Unmodelled` does."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise not_modelled(f"{cls._qualname}.{name}", cls._version)

    def __repr__(cls) -> str:
        return f"<class {cls._qualname}: not modelled by the simulated NPU host>"


def _unmodelled_class(qualname: str, version: str) -> type:
    """A name that is a class in torch_npu (`torch.npu.NPUGraph`, `torch.npu.Stream`): a real class, so
    what a program does with a class without using it works as on a device, in annotations
    (`torch.npu.NPUGraph | None`), `isinstance` tests (False: no object is one) and subclasses; making
    one, or reading the class's attributes, raises NotModelledError."""

    def __new__(cls, *args, **kwargs):
        raise not_modelled(qualname, version)

    name = qualname.rpartition(".")[2]
    namespace = {"__new__": __new__, "_qualname": qualname, "_version": version, "__module__": "torch_npu"}
    return _UnmodelledClass(name, (), namespace)


def _is_class_name(name: str) -> bool:
    """torch_npu spells its classes in CamelCase (`NPUGraph`, `Event`) and nothing else so: constants are
    UPPER_CASE, functions lower."""
    return name[:1].isupper() and not name.isupper()


class SurfaceModule(types.ModuleType):
    """A module whose public names are `public`: those in `modelled` work, the others are `Unmodelled`."""

    def __init__(self, name: str, version: str, public, modelled: dict, doc: str = "", label: str = "") -> None:
        super().__init__(name, doc)
        self._version = version
        self._public = frozenset(public)
        #: How user code spells the module, for messages: `torch.npu` rather than `torch_npu.npu`.
        self._label = label or name
        for attr, value in modelled.items():
            if attr.startswith("_") or self._has(attr):
                setattr(self, attr, value)

    def _has(self, name: str) -> bool:
        return name in self._public

    def __getattr__(self, name: str):
        if not name.startswith("__") and self._has(name):
            if _is_class_name(name):
                made = _unmodelled_class(f"{self._label}.{name}", self._version)
                setattr(self, name, made)  # one class per name: `isinstance` and annotations see the same
                return made
            return Unmodelled(f"{self._label}.{name}", self._version)
        raise AttributeError(
            f"module '{self._label}' has no attribute '{name}'"
            + (f" (not in torch_npu {self._version})" if not name.startswith("_") else "")
        )

    def __dir__(self):
        return sorted(set(super().__dir__()) | self._public)


class TorchNpuPackage(SurfaceModule):
    """`torch_npu`: the fused ops of the version's op list; any other public name is not modelled."""

    def _has(self, name: str) -> bool:
        if name.startswith("npu_"):
            return name in self._public
        return name == "_C" or not name.startswith("_")


class UnmodelledPackage(types.ModuleType):
    """A torch_npu submodule the host does not model: importing it works, reading any name from it fails."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(name, "not modelled by the simulated NPU host")
        self.__path__ = []
        self._version = version

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise not_modelled(f"{self.__name__}.{name}", self._version)


#: torch_npu modules imported for what they do on import: importing them cannot succeed silently.
_ACT_ON_IMPORT = ("torch_npu.contrib.transfer_to_npu",)


class UnmodelledFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Claims every `torch_npu.*` module the stand-in lacks, so a real torch_npu is never imported."""

    def __init__(self, version: str) -> None:
        self.version = version

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torch_npu.") and fullname not in sys.modules:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return UnmodelledPackage(spec.name, self.version)

    def exec_module(self, module) -> None:
        if module.__name__ in _ACT_ON_IMPORT:
            raise not_modelled(f"import {module.__name__} (it patches torch on import)", self.version)


def _parameters(schema: str) -> inspect.Signature | None:
    """The Python signature of an op schema `name(Tensor self, int dim=-1, *, ...) -> ...`."""
    match = re.match(r"\w+\((.*)\)\s*->", schema)
    if not match:
        return None
    params, kind = [], inspect.Parameter.POSITIONAL_OR_KEYWORD
    for part in filter(None, (p.strip() for p in match.group(1).split(","))):
        if part == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        declaration, has_default, _ = part.partition("=")
        name = declaration.split()[-1]
        default = None if has_default else inspect.Parameter.empty
        params.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(params)


def _fused_op(name: str, kernel, schema: str | None, version: str, calls: collections.Counter):
    """The reference kernel as torch_npu's op: the version's signature, NPU tensors only, counted."""
    signature = _parameters(schema) if schema else None

    @functools.wraps(kernel)
    def op(*args, **kwargs):
        if signature is not None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"torch_npu.{name}() in torch_npu {version}: {exc} (schema: {schema})") from None
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.device.type != "npu":
                raise RuntimeError(
                    f"Could not run 'npu::{name}' with arguments from the '{value.device.type.upper()}' backend: "
                    "torch_npu's fused ops take NPU tensors"
                )
        calls[name] += 1
        # The reference is written for one device and builds helper tensors on the CPU.
        with npu_device.mixed_devices_allowed():
            return kernel(*args, **kwargs)

    return op


def _amp_module(api: NpuApi) -> SurfaceModule:
    return SurfaceModule(
        "torch_npu.npu.amp", api.version, api.npu_amp, npu_runtime.amp_functions(), label="torch.npu.amp"
    )


def _plain_module(name: str, members: dict) -> types.ModuleType:
    module = types.ModuleType(name)
    for attr, value in members.items():
        setattr(module, attr, value)
    return module


def build_modules(api: NpuApi, rt: npu_runtime.Runtime) -> dict[str, types.ModuleType]:
    """The stand-in modules by their `sys.modules` names; `torch_npu.npu` is also `torch.npu`."""
    version = api.version
    random = npu_runtime.random_functions(rt)
    memory = npu_runtime.memory_functions()
    streams = npu_runtime.stream_functions()
    amp = _amp_module(api)
    mstx_module = _plain_module("torch_npu.npu.mstx", {"mstx": npu_runtime.mstx, "annotate": npu_runtime.annotate})
    modelled = {
        **npu_runtime.device_functions(rt),
        **memory,
        **streams,
        **random,
        **npu_runtime.autocast_functions(),
        **npu_runtime.sdp_functions(),
        **npu_runtime.compile_functions(),
        "amp": amp,
        "mstx": npu_runtime.mstx,
        "matmul": npu_runtime.Hf32Switch(default=False),
        "conv": npu_runtime.Hf32Switch(default=True),
        "backends": _plain_module("torch_npu.npu.backends", {"fft_plan_cache": npu_runtime.FftPlanCache()}),
        "random": _plain_module("torch_npu.npu.random", random),
        "memory": _plain_module("torch_npu.npu.memory", memory),
        "streams": _plain_module("torch_npu.npu.streams", streams),
        # What torch itself asks of a device module (torch.manual_seed, torch.amp, the serialization).
        "_is_in_bad_fork": lambda: False,
        "_lazy_init": lambda: None,
        "_npu_migrate_simulated": True,
    }
    npu = SurfaceModule(
        "torch_npu.npu", version, api.npu_names, modelled, "torch.npu on the simulated NPU host", label="torch.npu"
    )
    npu.__all__ = sorted(load_table("torch_npu_api.toml")["versions"][version]["npu_all"])

    calls: collections.Counter = collections.Counter()
    schemas = load_table("torch_npu_api.toml")["versions"][version].get("fused_op_schemas", {})
    ops = {
        name: _fused_op(name, kernel, schemas.get(name), version, calls)
        for name in sorted(api.fused_ops)
        if callable(kernel := getattr(reference, name, None))
    }
    distributed = SurfaceModule(
        "torch_npu.distributed",
        version,
        api.distributed,
        {"is_hccl_available": lambda: "hccl" in torch.distributed.Backend.backend_list},
    )
    package = TorchNpuPackage(
        "torch_npu",
        version,
        api.fused_ops,
        {**ops, "npu": npu, "distributed": distributed, "__version__": version, "_npu_migrate_calls": calls},
        f"A stand-in torch_npu {version} (npu-migrate's simulated NPU host): no CANN, no device.",
    )
    # The fused optimizers (`npu_optim`): in every sampled version, 2.1.0.post8 to 2.14.0.
    optim = _plain_module("torch_npu.optim", dict(npu_optim.CLASSES))
    package.optim = optim
    package.__path__ = []  # a package: `import torch_npu.x` goes to UnmodelledFinder
    modules = {
        "torch_npu.optim": optim,
        "torch_npu": package,
        "torch_npu.npu": npu,
        "torch_npu.npu.amp": amp,
        "torch_npu.npu.mstx": mstx_module,
        "torch_npu.distributed": distributed,
    }
    # As an installed torch_npu has: `importlib.util.find_spec("torch_npu")` (which migrated flash-attn
    # imports ask) raises for a module in sys.modules without one.
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name == "torch_npu")
    return modules
