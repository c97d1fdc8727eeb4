"""One smoke run in a fresh interpreter: `python -m npu_migrate.verify.smoke_worker` (started by `smoke`).

It makes the process a simulated NPU host (`--host npu`) or a plain CPU host with CUDA hidden
(`--host cpu`, for the original program), then runs the entry with the tree first on `sys.path` and
as the working directory:

* factory: a file whose `build()` returns (model, inputs). On the NPU host both move to "npu"; one
  forward pass in training mode, then, when the output holds a floating-point tensor with a gradient,
  a backward pass and an AdamW step;
* module: `import <name>`;
* script: `runpy.run_path` as `__main__`, with `sys.argv` = [script, *args]; `sys.exit(0)` is success.

The result (JSON at `--out`): the steps that ran, the fused-op calls, and the first exception with
the innermost frame inside the tree.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import runpy
import sys
import traceback
from collections.abc import Mapping

_FACTORY_MODULE = "_npu_migrate_smoke_factory"


def _frames_in(exc: BaseException, root: str, extra: tuple[str, ...]) -> list[dict]:
    """The traceback's frames inside the tree (or the factory), innermost last."""
    frames = []
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if path.startswith(root) or path in extra:
            frames.append({"file": path, "line": frame.lineno, "function": frame.name, "code": frame.line or ""})
    return frames


def _innermost(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return {"file": "?", "line": 0, "function": "?", "code": ""}
    frame = frames[-1]
    return {"file": frame.filename, "line": frame.lineno, "function": frame.name, "code": frame.line or ""}


def _error(exc: BaseException, stage: str, root: str, extra: tuple[str, ...]) -> dict:
    from npu_migrate.verify import reference

    frames = _frames_in(exc, root, extra)
    if isinstance(exc, reference.NpuOpError):
        kind = "npu_op"
    elif isinstance(exc, reference.NotModelledError):
        kind = "not_modelled"
    else:
        kind = "crash"
    message = str(exc)
    if isinstance(exc, SystemExit):
        message = f"the program exited with status {exc.code!r}"
    return {
        "stage": stage,
        "kind": kind,
        "type": type(exc).__name__,
        "message": message,
        "frames": frames,
        "where": frames[-1] if frames else _innermost(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def _move(value, device):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {key: _move(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_move(item, device) for item in value)
    return value


def _loss(output):
    """A scalar to differentiate: the output's `loss` when it has one, else its first float tensor's mean."""
    import torch

    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        candidates = [output["loss"]]
    else:
        candidates = []
        stack = [output]
        while stack:
            value = stack.pop(0)
            if isinstance(value, torch.Tensor):
                candidates.append(value)
            elif isinstance(value, Mapping):
                stack.extend(value.values())
            elif isinstance(value, (list, tuple)):
                stack.extend(value)
    for tensor in candidates:
        if tensor.is_floating_point() and tensor.requires_grad:
            return tensor.float().mean()
    return None


def _run_factory(path: str, device: str | None, steps: list[str]) -> None:
    import torch

    spec = importlib.util.spec_from_file_location(_FACTORY_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_FACTORY_MODULE] = module
    spec.loader.exec_module(module)
    steps.append("import")
    build = getattr(module, "build", None)
    if not callable(build):
        raise _UsageError(f"{path}: the factory defines no build() function")
    built = build()
    if not (isinstance(built, tuple) and len(built) == 2):
        raise _UsageError(f"{path}: build() must return (model, inputs), got {type(built).__name__}")
    model, inputs = built
    steps.append("build")
    if device is not None:
        model = model.to(device) if hasattr(model, "to") else model
        inputs = _move(inputs, device)
    if hasattr(model, "train"):
        model.train()
    if isinstance(inputs, Mapping):
        output = model(**inputs)
    elif isinstance(inputs, (list, tuple)):
        output = model(*inputs)
    else:
        output = model(inputs)
    steps.append("forward")
    loss = _loss(output)
    if loss is None:
        return
    loss.backward()
    steps.append("backward")
    params = [p for p in model.parameters() if p.grad is not None] if hasattr(model, "parameters") else []
    if params:
        torch.optim.AdamW(params, lr=1e-3).step()
        steps.append("optimizer step")


class _UsageError(Exception):
    """The entry itself is wrong (no build(), no such module): the caller's mistake, not the program's."""


def run(root: str, kind: str, entry: str, args: list[str], host: str, version: str | None, devices: int) -> dict:
    root = os.path.join(os.path.abspath(root), "")
    result: dict = {"host": host, "steps": [], "fused_calls": {}, "error": None, "torch_npu_version": None}
    steps = result["steps"]
    stage = "setup"
    extra: tuple[str, ...] = ()
    installed = None
    try:
        from npu_migrate.verify import npu_host

        if host == "npu":
            installed = npu_host.install(version, device_count=devices)
            result["torch_npu_version"] = installed.torch_npu_version
        else:
            npu_host.hide_cuda()
        os.chdir(root)
        path = [root.rstrip(os.sep)]
        if kind == "script":
            entry = os.path.abspath(entry)
            path.insert(0, os.path.dirname(entry))
            extra = (entry,)
        elif kind == "factory":
            entry = os.path.abspath(entry)
            path.append(os.path.dirname(entry))
            extra = (entry,)
        sys.path[:] = path + [p for p in sys.path if p not in ("", *path)]
        stage = "run"
        if kind == "factory":
            _run_factory(entry, "npu" if host == "npu" else None, steps)
        elif kind == "module":
            try:
                spec = importlib.util.find_spec(entry)
            except ModuleNotFoundError:
                spec = None
            if spec is None:
                raise _UsageError(f"no module named {entry!r} under {root}")
            importlib.import_module(entry)
            steps.append("import")
        else:
            sys.argv = [entry, *args]
            try:
                runpy.run_path(entry, run_name="__main__")
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise
            steps.append("script")
    except _UsageError as exc:
        result["error"] = {"stage": "usage", "kind": "usage", "type": "UsageError", "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides the exit code
        if isinstance(exc, KeyboardInterrupt):
            raise
        if stage == "setup":
            result["error"] = {"stage": "setup", "kind": "usage", "type": type(exc).__name__, "message": str(exc)}
        else:
            result["error"] = _error(exc, stage, root, extra)
    finally:
        if installed is not None:
            result["fused_calls"] = dict(sorted(installed.fused_calls.items()))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npu_migrate.verify.smoke_worker")
    parser.add_argument("--root", required=True)
    parser.add_argument("--kind", choices=("factory", "module", "script"), required=True)
    parser.add_argument("--entry", required=True)
    parser.add_argument("--host", choices=("npu", "cpu"), default="npu")
    parser.add_argument("--torch-npu-version")
    parser.add_argument("--device-count", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    script_args = options.args[1:] if options.args[:1] == ["--"] else options.args
    result = run(
        options.root,
        options.kind,
        options.entry,
        script_args,
        options.host,
        options.torch_npu_version,
        options.device_count,
    )
    with open(options.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
