"""One side of `npu-migrate verify`, run in a fresh interpreter: `python -m npu_migrate.verify.worker`.

A fresh process per side is what makes the comparison honest: the original and the migrated tree
define the same module names (`transformers.models.llama...`), and only an empty `sys.modules` lets
each side import its own copy. The worker puts its tree first on `sys.path`, imports the factory,
seeds every generator, calls `build()`, runs one forward pass under `torch.no_grad()` and writes the
output tensors plus what it learnt (fused-op calls per module, the mode, or the error) to `--out`.

In the migrated process the fused branches must really run:

* "npu" mode, when torch_npu imports and an NPU is present: model and inputs move to the NPU and the
  real kernels run; calls are counted through a proxy over torch_npu. NOT TESTED: no NPU was available
  when this was written; it relies only on the prelude's own `_is_npu` and on `Tensor.to("npu")`.
* "reference" mode otherwise: every migrated module (a file under the migrated tree that carries the
  prelude) gets the CPU reference as `torch_npu` and an `_is_npu` that is true for any tensor, so each
  branch whose other guards hold takes the fused path. Modules are patched as they are imported, so
  ones imported lazily during the forward pass are covered too.

A file of a package imports the helpers from the package's helper module (`_npu_fused.py`) instead of
defining them. Each such file gets a private copy of that module's functions, patched as above, in
place of the names it imported: its kernel calls are counted as its own, as if the helpers were inline.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.abc
import importlib.util
import os
import random
import re
import sys
import traceback
import types
from collections.abc import Mapping

import torch

from npu_migrate.verify import op_counts, reference

#: In a migrated module's source: its own fused-op prelude (not names imported from elsewhere).
PRELUDE_MARK = "def _is_npu("
_SITE = re.compile(r"torch_npu\.(npu_\w+)\s*\(")
#: The last part of the name of a package's helper module (`transformers._npu_fused`).
HELPER_MODULE = "_npu_fused"
_FACTORY_MODULE = "_npu_migrate_verify_factory"


class _Patcher(importlib.abc.MetaPathFinder):
    """Patches each migrated module right after it executes, wherever and whenever it is imported."""

    def __init__(self, root: str, install) -> None:
        self.root = os.path.join(os.path.abspath(root), "")
        self.install = install
        self.modules: dict[str, dict] = {}
        self.helper_modules: dict[str, types.ModuleType] = {}

    def owns(self, filename: str | None) -> bool:
        return bool(filename) and os.path.abspath(filename).startswith(self.root)

    def find_spec(self, fullname, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if self.owns(spec.origin) and run is not None and not getattr(run, "_npu_migrate_verify", False):
            # FileFinder makes a loader per module, so shadowing the method on the instance keeps the
            # loader's type and everything else about it; the mark stops a shared loader (zipimport)
            # from being wrapped twice.
            def exec_module(module, _run=run):
                _run(module)
                self.patch(module)

            exec_module._npu_migrate_verify = True
            loader.exec_module = exec_module
        return spec

    def patch(self, module: types.ModuleType) -> None:
        if module.__name__ in self.modules or not self.owns(getattr(module, "__file__", None)):
            return
        if module.__name__.rpartition(".")[2] == HELPER_MODULE:
            # Patched for any caller this finder does not see; the files importing it are reported.
            if module.__name__ not in self.helper_modules and _has_prelude(module):
                self.helper_modules[module.__name__] = module
                self.install(module)
            return
        helpers = _helper_module_of(module)
        if helpers is None and not _has_prelude(module):
            return
        source = _source(module)
        if helpers is not None:
            self.modules[module.__name__] = self._install_copy(module, helpers)
            return
        if PRELUDE_MARK not in source:
            return  # it imported the prelude's names from elsewhere: not a migrated module itself
        sites = collections.Counter(_SITE.findall(source))
        calls = self.install(module)
        self.modules[module.__name__] = {"file": module.__file__, "sites": dict(sites), "calls": calls}

    def _install_copy(self, module: types.ModuleType, helpers: types.ModuleType) -> dict:
        """Rebinds the helpers `module` imported to copies of the helper module's functions whose globals
        are a patched namespace of the module's own."""
        namespace = dict(vars(helpers))
        copy = types.ModuleType(helpers.__name__)
        for name, value in vars(helpers).items():
            if isinstance(value, types.FunctionType) and value.__globals__ is vars(helpers):
                namespace[name] = _rebound(value, vars(copy))
        vars(copy).update(namespace)
        calls = self.install(copy)
        imported = [
            name for name, value in vars(module).items() if name in vars(helpers) and value is vars(helpers)[name]
        ]
        for name in imported:
            setattr(module, name, getattr(copy, name))
        ops = _ops_by_helper(helpers)
        source = _source(module)
        sites = collections.Counter(
            op for name in imported for op in ops.get(name, ()) for _ in re.finditer(rf"\b{name}\s*\(", source)
        )
        return {"file": module.__file__, "sites": dict(sites), "calls": calls}

    def sweep(self) -> None:
        """Modules that bypassed the finder (loaded from a file spec, say) are patched here."""
        for module in list(sys.modules.values()):
            if isinstance(module, types.ModuleType):
                self.patch(module)


def _source(module: types.ModuleType) -> str:
    try:
        with open(module.__file__, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def _helper_module_of(module: types.ModuleType) -> types.ModuleType | None:
    """The package helper module whose functions `module` imported, if any."""
    for value in vars(module).values():
        if isinstance(value, types.FunctionType):
            name = value.__module__ or ""  # None for a function made by exec without a `__name__`
            owner = sys.modules.get(name)
            if name.rpartition(".")[2] == HELPER_MODULE and owner is not None and owner is not module:
                return owner
    return None


def _rebound(function: types.FunctionType, namespace: dict) -> types.FunctionType:
    """`function` reading its globals from `namespace`."""
    copy = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__dict__.update(function.__dict__)
    copy.__qualname__, copy.__module__, copy.__doc__ = function.__qualname__, function.__module__, function.__doc__
    return copy


def _ops_by_helper(helpers: types.ModuleType) -> dict[str, set[str]]:
    """Helper function name -> the torch_npu ops it reaches, through the other helpers it calls."""
    tree = ast.parse(_source(helpers))
    direct, callees = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            direct[node.name] = set(_SITE.findall(ast.unparse(node)))
            callees[node.name] = {
                n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
    reached = {}
    for name in direct:
        seen, stack, ops = set(), [name], set()
        while stack:
            current = stack.pop()
            if current in seen or current not in direct:
                continue
            seen.add(current)
            ops |= direct[current]
            stack.extend(callees[current])
        reached[name] = ops
    return reached


def _has_prelude(module: types.ModuleType) -> bool:
    """Whether the module has the names of the fused-op prelude: `torch_npu` and `_is_npu`."""
    namespace = vars(module)
    return "torch_npu" in namespace and callable(namespace.get("_is_npu"))


def _reference_installer(generator: torch.Generator):
    def install(module: types.ModuleType) -> collections.Counter:
        fake = reference.torch_npu_module(generator=generator)
        module.torch_npu = fake
        module._is_npu = lambda x: isinstance(x, torch.Tensor)
        return fake.calls

    return install


class _CountingTorchNpu(types.ModuleType):
    """The real torch_npu, with the npu_* ops counted. Only used on an NPU: NOT TESTED on hardware."""

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__("torch_npu")
        self._real = real
        self.calls = collections.Counter()

    def __getattr__(self, name):
        value = getattr(self._real, name)
        if name.startswith("npu_") and callable(value):

            def counted(*args, _value=value, _name=name, **kwargs):
                self.calls[_name] += 1
                return _value(*args, **kwargs)

            return counted
        return value


def _npu_installer(real: types.ModuleType):
    def install(module: types.ModuleType) -> collections.Counter:
        proxy = _CountingTorchNpu(real)
        module.torch_npu = proxy  # `_is_npu` stays the prelude's own: the device decides
        return proxy.calls

    return install


def _try_npu() -> types.ModuleType | None:
    try:
        import torch_npu  # noqa: F401 - registers torch.npu
    except Exception:  # noqa: BLE001 - no CANN, wrong version, ...: all mean "no NPU here"
        return None
    try:
        available = torch.npu.is_available()
    except Exception:  # noqa: BLE001
        available = False
    return sys.modules["torch_npu"] if available else None


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def _to(value, device=None, dtype=None):
    """Moves tensors in nested inputs; casts floating-point ones to `dtype` (token ids stay integers)."""
    if isinstance(value, torch.Tensor):
        target = dtype if dtype is not None and value.is_floating_point() else value.dtype
        return value.to(device=device or value.device, dtype=target)
    if isinstance(value, Mapping):
        return {key: _to(item, device, dtype) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return (
            type(value)(_to(item, device, dtype) for item in value)
            if type(value) in (list, tuple)
            else tuple(_to(item, device, dtype) for item in value)
        )
    return value


def _flatten(value, name: str, into: list) -> None:
    """Output tensors with readable names: `output`, `logits`, `hidden_states[2]`, `output[0]`."""
    if isinstance(value, torch.Tensor):
        into.append((name or "output", value.detach().to("cpu")))
    elif isinstance(value, Mapping):  # also HF ModelOutput, an OrderedDict
        for key, item in value.items():
            _flatten(item, f"{name}.{key}" if name else str(key), into)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _flatten(item, f"{name or 'output'}[{i}]", into)
    # anything else (a KV cache object, None, a number) is not a numerical output to compare


def _where(exc: BaseException, user_files: list[str], root: str) -> str:
    """file:line of the innermost frame in user code (the factory or the tree), else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = os.path.join(os.path.abspath(root), "")
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if path in user_files or path.startswith(root):
            return f"{frame.filename}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def _training_step_counts(model, inputs, output, loss_fn, patcher, seed: int):
    """The ops of one training step (forward with autograd, the loss, backward), counted as the forward is,
    where the factory provides a loss: a `loss(output)` function beside `build()`, or an output with a
    `loss` tensor (HF models given labels). None where it provides none; a message where the step fails
    (the forward was compared; the counts are extra). The fused-op calls per module stay the forward's."""
    has_loss = isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor)
    if not callable(loss_fn) and not has_loss:
        return None
    saved = {name: dict(info["calls"]) for name, info in patcher.modules.items()}
    try:
        _seed(seed)
        with torch.enable_grad(), op_counts.counting() as counter:
            out = _call(model, inputs)
            loss = loss_fn(out) if callable(loss_fn) else out["loss"]
            loss.backward()
        return counter.to_dict()
    except Exception as exc:  # noqa: BLE001 - the forward passed; the step's counts are a bonus
        return f"operator counts of a training step skipped: {type(exc).__name__}: {exc}"
    finally:
        for name, info in patcher.modules.items():
            info["calls"].clear()
            info["calls"].update(saved.get(name, {}))


def run(root: str, factory: str, role: str, dtype: str, seed: int, mode: str, stand_in: bool = False) -> dict:
    """One side's forward pass. `stand_in`: the migrated tree imports torch_npu at module level (as
    `apply` writes it), so where no torch_npu imports, the simulated NPU host of `verify --smoke` is
    installed before the factory imports anything: the tool's own output runs on any host."""
    root, factory = os.path.abspath(root), os.path.abspath(factory)
    # The tree first, then the factory's folder; the caller's cwd is dropped so both sides see the same
    # path apart from their tree.
    cwd = os.getcwd()
    sys.path[:] = [root, os.path.dirname(factory)] + [p for p in sys.path if p not in ("", cwd, root)]
    result: dict = {"role": role, "mode": "cpu", "modules": {}, "outputs": [], "error": None, "warnings": []}
    stage = "setup"
    patcher = None
    try:
        real_npu = _try_npu() if role == "migrated" and mode in ("auto", "npu") else None
        if mode == "npu" and real_npu is None and role == "migrated":
            raise RuntimeError("--mode npu: torch_npu did not import or no NPU is available")
        if role == "migrated" and real_npu is None and stand_in and "torch_npu" not in sys.modules:
            from npu_migrate.verify import npu_host

            npu_host.install()
            result["warnings"].append(
                "the migrated tree imports torch_npu, which is not installed: it ran on the simulated NPU host "
                "(verify --smoke's stand-in, installed before it imported)"
            )
        generator = torch.Generator().manual_seed(seed)
        if role == "migrated":
            result["mode"] = "npu" if real_npu is not None else "reference"
            installer = _npu_installer(real_npu) if real_npu is not None else _reference_installer(generator)
        else:
            installer = None
        patcher = _Patcher(root, installer or (lambda module: collections.Counter()))
        if installer is not None:
            sys.meta_path.insert(0, patcher)

        _seed(seed)
        stage = "import"
        spec = importlib.util.spec_from_file_location(_FACTORY_MODULE, factory)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_FACTORY_MODULE] = module
        spec.loader.exec_module(module)
        build = getattr(module, "build", None)
        if not callable(build):
            result["error"] = {
                "stage": "import",
                "type": "UsageError",
                "where": factory,
                "message": "the factory defines no build() function",
                "traceback": "",
            }
            return result
        stage = "build"
        _seed(seed)
        built = build()
        if not (isinstance(built, tuple) and len(built) == 2):
            raise TypeError(f"build() must return (model, inputs), got {type(built).__name__}")
        model, inputs = built
        target = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        device = "npu" if result["mode"] == "npu" else None
        if hasattr(model, "to"):
            model = model.to(device=device, dtype=target) if device else model.to(dtype=target)
        if hasattr(model, "eval"):
            model.eval()
        inputs = _to(inputs, device, target)
        if installer is not None:
            patcher.sweep()
        stage = "forward"
        _seed(seed)
        # Counted at the dispatcher on both sides (`op_counts`): the evidence that the fusion pays.
        with torch.no_grad(), op_counts.counting() as counter:
            if isinstance(inputs, dict):
                out = model(**inputs)
            elif isinstance(inputs, (list, tuple)):
                out = model(*inputs)
            else:
                out = model(inputs)
        result["op_counts"] = counter.to_dict()
        step = _training_step_counts(model, inputs, out, getattr(module, "loss", None), patcher, seed)
        if isinstance(step, str):
            result["warnings"].append(step)
        elif step is not None:
            result["op_counts_step"] = step
        if installer is not None:
            patcher.sweep()
        else:
            # A migrated module in the original tree means the two trees are the wrong way round.
            stale = [
                m.__name__
                for m in list(sys.modules.values())
                if isinstance(m, types.ModuleType) and patcher.owns(getattr(m, "__file__", None)) and _has_prelude(m)
            ]
            if stale:
                result["warnings"].append(
                    "the original tree already contains fused branches (in " + ", ".join(sorted(stale)[:3]) + ")"
                )
        _flatten(out, "", result["outputs"])
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides the exit code
        if isinstance(exc, KeyboardInterrupt):
            raise
        result["error"] = {
            "stage": stage,
            "type": type(exc).__name__,
            "message": str(exc),
            "where": _where(exc, [factory], root),
            "traceback": traceback.format_exc(),
            "npu_op": isinstance(exc, reference.NpuOpError),
            "not_modelled": isinstance(exc, reference.NotModelledError),
        }
    finally:
        if role == "migrated" and patcher is not None:
            result["modules"] = {
                name: {"file": info["file"], "sites": info["sites"], "calls": dict(info["calls"])}
                for name, info in sorted(patcher.modules.items())
            }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npu_migrate.verify.worker")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--factory", required=True)
    parser.add_argument("--role", choices=("original", "migrated"), required=True)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=("auto", "reference", "npu"), default="auto")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stand-in", action="store_true", help="install the simulated NPU host first")
    args = parser.parse_args(argv)
    result = run(args.dir, args.factory, args.role, args.dtype, args.seed, args.mode, args.stand_in)
    torch.save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
