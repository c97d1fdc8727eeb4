"""Mode `custom_kernels`: native code written for NVIDIA GPUs, and the builds that compile it.

Found statically, file by file:

* `.cu` / `.cuh` sources: each `__global__` kernel, with the CUDA libraries and intrinsics it relies on
  (a kernel built on cuBLAS calls ports differently from one built on warp shuffles);
* C++ sources (`.cpp`, `.cc`, `.h`, ...) that include the CUDA runtime or ATen/c10 CUDA headers, with
  the operators their `PYBIND11_MODULE` / `TORCH_LIBRARY` blocks bind (each needs an NPU implementation);
* in Python: `CUDAExtension(...)`, `cpp_extension.load(...)` with CUDA sources, `load_inline(...)` with
  `cuda_sources`, CUDA source held in string literals, and `@triton.jit` kernels.

The codemod's `kernels` rules already report `.cu` kernels and the extension builds; their findings are
this mode's, and the analysis adds only what they do not see (kernels in Python strings, C++ bindings
that include CUDA headers, triton kernels), plus the table of what each item leans on.
"""

from __future__ import annotations

import ast
import re

from npu_migrate.analyze import rules as R
from npu_migrate.analyze.project import (
    Context,
    Mode,
    ModeResult,
    Project,
    Source,
    Table,
    finding_key,
    location_key,
    relative,
    walk,
)
from npu_migrate.engine.registry import family_of
from npu_migrate.files.discovery import discover
from npu_migrate.findings import Severity

CUDA_SUFFIXES = frozenset({".cu", ".cuh"})
CPP_SUFFIXES = frozenset({".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh"})

_KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:[\w:<>,\s*&]+?\s+)?(\w+)\s*\(")
_LAUNCH = re.compile(r"<<<")
#: What a kernel leans on, for "what must be ported": library calls port to aclnn/torch ops, intrinsics to Ascend C.
_FEATURES = {
    "cuBLAS": re.compile(r"\bcublas\w*"),
    "cuDNN": re.compile(r"\bcudnn\w*"),
    "CUB": re.compile(r"\bcub::"),
    "Thrust": re.compile(r"\bthrust::"),
    "CUTLASS": re.compile(r"\bcutlass::"),
    "cuRAND": re.compile(r"\bcurand\w*"),
    "atomics": re.compile(r"\batomic(?:Add|Max|Min|CAS|Exch)\b"),
    "warp shuffles": re.compile(r"__shfl\w*"),
    "shared memory": re.compile(r"__shared__"),
    "block sync": re.compile(r"__syncthreads\b"),
    "tensor cores (wmma/mma)": re.compile(r"\bwmma::|\bmma\.sync|\bnvcuda::"),
}
_CPP_CUDA = re.compile(
    r'#\s*include\s*[<"](?:cuda\w*\.h|cuda_runtime\w*\.h|ATen/cuda/[^>"]+|c10/cuda/[^>"]+|cublas\w*\.h|cudnn\w*\.h)[>"]'
    r"|\bat::cuda::|\bc10::cuda::|\bCUDAGuard\b|\bcudaStream_t\b|\.is_cuda\(\)"
)
_BINDING = re.compile(r"""\bm\.(?:def|impl)\s*\(\s*"(\w+)\"""")
_PORT_KERNEL = "rewrite in Ascend C as an aclnn operator (or with torch ops / torch_npu fused ops)"


def _line_of(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def kernels_in(text: str) -> list[tuple[str, int]]:
    """`__global__` kernels of CUDA source text: (name, offset)."""
    return [(m.group(1), m.start()) for m in _KERNEL.finditer(text)]


def features_of(text: str) -> list[str]:
    return [name for name, pattern in _FEATURES.items() if pattern.search(text)]


# --- Python files -------------------------------------------------------------------------------------

_EXT = "torch.utils.cpp_extension."


def _string_value(node: ast.AST | None, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [_string_value(e, constants) for e in node.elts]
        return "\n".join(p for p in parts if p) or None
    return None


def _sources(node: ast.AST | None) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _arg(call: ast.Call, position: int | None, name: str) -> ast.AST | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return call.args[position] if position is not None and len(call.args) > position else None


def scan(source: Source, context: Context) -> dict | None:
    text = source.text
    if "cpp_extension" not in text and "__global__" not in text and "triton" not in text:
        return None
    constants = {
        t.id: n.value.value
        for n in source.tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    rows, findings = [], []

    def add(node, kind, name, detail, action, rule=None, message=None, severity=None, pos=None):
        line, col = pos or source.pos(node)
        rows.append([f"{source.display}:{line}:{col}", kind, name, detail, action])
        if rule is not None:
            findings.append(R.finding(rule, source.display, line, col, message, severity))

    for node in walk(source.tree):
        if isinstance(node, ast.Call):
            qualname = source.names.resolve(node.func) or ""
            if not qualname.startswith(_EXT):
                continue
            api = qualname[len(_EXT) :]
            name_node = _arg(node, 0, "name")
            name = name_node.value if isinstance(name_node, ast.Constant) else "?"
            if api == "CUDAExtension":
                files = _sources(_arg(node, 1, "sources"))
                add(
                    node,
                    "extension_build",
                    name,
                    ", ".join(files),
                    "port the .cu sources to Ascend C; build with torch_npu.utils.cpp_extension.NpuExtension",
                )
            elif api == "load":
                files = _sources(_arg(node, 1, "sources"))
                with_cuda = _arg(node, None, "with_cuda")
                cuda = [f for f in files if f.endswith((".cu", ".cuh"))]
                if cuda or (isinstance(with_cuda, ast.Constant) and with_cuda.value is True):
                    add(node, "jit_build", name, ", ".join(files), "port the CUDA sources; load the NPU build instead")
                else:
                    add(
                        node,
                        "jit_build",
                        name,
                        ", ".join(files),
                        "host C++: builds and runs on the CPU of an NPU machine",
                    )
            elif api == "load_inline":
                cuda_node = _arg(node, 2, "cuda_sources")
                if cuda_node is None or (isinstance(cuda_node, ast.Constant) and cuda_node.value is None):
                    add(
                        node,
                        "jit_build",
                        name,
                        "cpp_sources only",
                        "host C++: builds and runs on the CPU of an NPU machine",
                    )
                    continue
                code = _string_value(cuda_node, constants) or ""
                kernels = [k for k, _ in kernels_in(code)]
                add(
                    node,
                    "jit_build",
                    name,
                    f"kernels: {', '.join(kernels) or 'not visible statically'}",
                    "port the kernels; load the NPU build instead",
                )
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if (source.names.resolve(target) or "").startswith(
                    ("triton.jit", "triton.autotune", "triton.heuristics")
                ):
                    add(
                        node,
                        "triton_kernel",
                        node.name,
                        "",
                        "port with triton-ascend, or rewrite with torch ops",
                        R.CUDA_KERNEL,
                        f"triton kernel {node.name} is compiled for NVIDIA GPUs; port it with "
                        "triton-ascend or rewrite it with torch operators",
                    )
                    break
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
            start_line, _ = source.pos(node)
            for kernel, offset in kernels_in(node.value):
                line = start_line + node.value.count("\n", 0, offset)
                if line == start_line:
                    pos = source.pos(node)
                else:
                    pos = (line, offset - (node.value.rfind("\n", 0, offset) + 1) + 1)
                add(
                    node,
                    "cuda_kernel",
                    kernel,
                    "inline CUDA source",
                    _PORT_KERNEL,
                    R.CUDA_KERNEL,
                    f"CUDA kernel {kernel} (in a Python string) must be ported: {_PORT_KERNEL}",
                    pos=pos,
                )
    if not rows:
        return None
    return {"rows": rows, "findings": findings}


# --- native sources ----------------------------------------------------------------------------------


def native_sources(project: Project) -> tuple[list[list], list]:
    """Rows and findings for the .cu / C++ files under the analysed paths."""
    suffixes = CUDA_SUFFIXES | CPP_SUFFIXES
    found = discover(project.paths, lambda p: p.suffix in suffixes, respect_gitignore=project.respect_gitignore)
    rows, findings = [], []
    for path in found.files:
        display = relative(path, project.root)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            rows.append([f"{display}:1:1", "unreadable", path.name, exc.strerror or str(exc), ""])
            continue
        if path.suffix in CUDA_SUFFIXES:
            features = features_of(text)
            detail = ", ".join(features) or "plain CUDA C++"
            kernels = kernels_in(text)
            launches = len(_LAUNCH.findall(text))
            # The kernels rule family reports .cu / .cuh files; this table adds what each kernel leans on.
            for kernel, offset in kernels:
                line, col = _line_of(text, offset)
                rows.append([f"{display}:{line}:{col}", "cuda_kernel", kernel, detail, _PORT_KERNEL])
            if not kernels:
                rows.append(
                    [
                        f"{display}:1:1",
                        "cuda_source",
                        path.name,
                        f"{detail}; {launches} launches",
                        "port with the kernels that use it",
                    ]
                )
            continue
        match = _CPP_CUDA.search(text)
        bindings = sorted(set(_BINDING.findall(text)))
        if match is None:
            if bindings:
                rows.append(
                    [
                        f"{display}:1:1",
                        "host_cpp",
                        path.name,
                        "binds " + ", ".join(bindings),
                        "host C++: portable; the ops it binds need NPU tensors handled",
                    ]
                )
            continue
        line, col = _line_of(text, match.start())
        bound = f"; binds {', '.join(bindings)}" if bindings else ""
        rows.append(
            [
                f"{display}:{line}:{col}",
                "cuda_cpp",
                path.name,
                f"uses {match.group(0).strip()}{bound}",
                "replace the CUDA runtime calls; register the ops for the NPU (PrivateUse1) device",
            ]
        )
        findings.append(
            R.finding(
                R.CUDA_KERNEL,
                display,
                line,
                col,
                f"C++ source depends on CUDA ({match.group(0).strip()}){bound}: replace the CUDA runtime calls and "
                "register the operators for the NPU (PrivateUse1) device",
                Severity.WARNING,
            )
        )
    return rows, findings


def is_kernel_rule(rule_id: str) -> bool:
    """The codemod's own rules about CUDA sources and extension builds (the `kernels` family)."""
    try:
        return family_of(rule_id) == "kernels"
    except KeyError:
        return False


def collect(project: Project, result: ModeResult) -> None:
    rows, findings = native_sources(project)
    findings.extend(f for f in project.rule_findings if is_kernel_rule(f.rule_id))
    for _, facts in project.facts("custom_kernels"):
        rows.extend(facts["rows"])
        findings.extend(facts["findings"])
    rows.sort(key=lambda r: location_key(r[0]))
    result.findings = sorted(findings, key=finding_key)
    result.tables = [
        Table(
            "custom_kernels.csv",
            "Custom kernels and extension builds",
            ["location", "kind", "name", "detail", "what_to_port"],
            rows,
        )
    ]
    kinds: dict[str, int] = {}
    for row in rows:
        kinds[row[1]] = kinds.get(row[1], 0) + 1
    result.summary = [
        f"{len(rows)} native-code items: " + (", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none")
    ]
    result.data = {"items": [dict(zip(result.tables[0].header, row)) for row in rows], "by_kind": kinds}


MODE = Mode("custom_kernels", "Custom kernels", scan=scan, collect=collect)
