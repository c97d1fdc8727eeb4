"""Custom CUDA kernels: never rewritten, always reported, because they need an Ascend C port.

`.cu` / `.cuh` sources are listed kernel by kernel; Python builds of CUDA extensions
(`CUDAExtension`, `torch.utils.cpp_extension.load` / `load_inline` with CUDA sources) are reported at
the call. `npu-migrate analyze --mode custom_kernels` lists the same findings with what to port.
"""

from __future__ import annotations

import re

import libcst as cst

from npu_migrate.engine.checkers import Checker, TextChecker
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.engine.textfiles import TextReport
from npu_migrate.files import kinds
from npu_migrate.findings import Severity
from npu_migrate.transforms.common.strings import string_value

CUDA_KERNEL = Rule(
    id="NPU801",
    name="cuda-kernel-source",
    family="kernels",
    summary="CUDA kernels in `.cu` / `.cuh` files are reported: they need an Ascend C port",
    what="""
    Reports each `__global__` kernel of a `.cu` / `.cuh` file. Port it to Ascend C (or replace it with
    torch / torch_npu operators) and build it with torch_npu's `cpp_extension` (`NpuExtension`).
    """,
    why="""
    NPUs do not run CUDA C++: the kernel cannot be compiled or launched on an NPU host.
    """,
    example=Example(
        path="scale.cu",
        before="""
            __global__ void scale(float* out, const float* x, float s, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) out[i] = s * x[i];
            }
        """,
        reports="CUDA kernel `scale` needs an Ascend C port",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    targets=EVERY_TARGET,
)

CUDA_EXTENSION = Rule(
    id="NPU802",
    name="cuda-extension-build",
    family="kernels",
    summary="`CUDAExtension` / `cpp_extension.load(_inline)` builds of CUDA code are reported",
    what="""
    Reports `CUDAExtension(...)` and `torch.utils.cpp_extension.load(...)` / `load_inline(...)` calls
    that build CUDA sources. Port the kernels to Ascend C and build them with
    `torch_npu.utils.cpp_extension.NpuExtension`, or replace the extension with torch operators.
    """,
    why="""
    A CUDA extension cannot be built or loaded on an NPU host: there is no nvcc and no CUDA runtime.
    """,
    example=Example(
        before="""
            from torch.utils.cpp_extension import load_inline

            CPP = "torch::Tensor scale(torch::Tensor x, double s);"
            CUDA = "torch::Tensor scale(torch::Tensor x, double s) { return x * s; }"
            ext = load_inline("ops", cpp_sources=CPP, cuda_sources=CUDA, functions=["scale"])
        """,
        reports="the CUDA code needs an Ascend C port",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    targets=EVERY_TARGET,
)

_GLOBAL = re.compile(r"__global__\s+(?:[\w:<>,\s\*&]+?\s+)?(\w+)\s*\(")
_BUILDERS = frozenset({"CUDAExtension", "load", "load_inline", "BuildExtension"})


class CudaSourceChecker(TextChecker):
    rules = (CUDA_KERNEL,)
    kinds = frozenset({kinds.CUDA_SOURCE})

    def check(self, text: str, kind: str) -> list[TextReport]:
        if CUDA_KERNEL.id not in self.enabled:
            return []
        reports = []
        for number, code in enumerate(_without_comments(text).splitlines(), start=1):
            for match in _GLOBAL.finditer(code):
                reports.append(
                    TextReport(
                        CUDA_KERNEL,
                        number,
                        match.start() + 1,
                        f"CUDA kernel `{match.group(1)}` needs an Ascend C port (or a torch / torch_npu operator)",
                        CUDA_KERNEL.severity,
                    )
                )
        if not reports:  # headers and host code still mean CUDA-only code to port
            reports.append(
                TextReport(CUDA_KERNEL, 1, 1, "CUDA source file: needs an Ascend C port", CUDA_KERNEL.severity)
            )
        return reports


def _without_comments(text: str) -> str:
    """C++ source with `//` and `/* */` comments blanked out, keeping every line and column in place."""
    return _C_COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


class CudaExtensionChecker(Checker):
    rules = (CUDA_EXTENSION,)
    markers = ("cpp_extension", "CUDAExtension", "load_inline")

    @classmethod
    def wants(cls, index) -> bool:
        return index.uses("cpp_extension", "CUDAExtension", "load_inline")

    def __init__(self, ctx, enabled: frozenset[str]) -> None:
        super().__init__(ctx, enabled)
        self._loads: list[cst.Call] = []  # `load(...)` calls whose sources are not literals (a parameter)
        self._cuda_files: list[cst.SimpleString] = []  # "kernel.cu" anywhere in the file
        self._toolchain: list[cst.CSTNode] = []  # CUDA_HOME, "nvcc"
        self._imported: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        qualname = self.ctx.qualname(node.func) or ""
        if not qualname.startswith("torch.utils.cpp_extension.") or qualname.rsplit(".", 1)[-1] not in _BUILDERS:
            return
        name = qualname.rsplit(".", 1)[-1]
        if name == "CUDAExtension":
            self.report(CUDA_EXTENSION, node, "`CUDAExtension`: its CUDA sources need an Ascend C port (NpuExtension)")
        elif name == "load_inline" and any(a.keyword and a.keyword.value == "cuda_sources" for a in node.args):
            self.report(CUDA_EXTENSION, node, "`load_inline` with `cuda_sources`: the CUDA code needs an Ascend C port")
        elif name == "load" and self._builds_cuda(node):
            self.report(CUDA_EXTENSION, node, "`load` of `.cu` sources: the CUDA code needs an Ascend C port")
        elif name == "load":
            self._loads.append(node)

    # Sources handed to a helper (`def _load(name, sources): return load(name=name, sources=sources)`,
    # called with `["fused.cpp", "fused_kernel.cu"]`) and the CUDA toolchain beside them: the file builds CUDA.

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        self._imported.add(id(node.name))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node) or ""
        if value.endswith((".cu", ".cuh")):
            self._cuda_files.append(node)
        elif value == "nvcc" or value.endswith("/nvcc") or value.startswith("nvcc "):
            self._toolchain.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "CUDA_HOME" and id(node) not in self._imported and self._is_cuda_home(node):
            self._toolchain.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "CUDA_HOME" and self._is_cuda_home(node):
            self._toolchain.append(node)

    def _is_cuda_home(self, node: cst.BaseExpression) -> bool:
        return self.ctx.qualname(node) == "torch.utils.cpp_extension.CUDA_HOME"

    def finish(self) -> None:
        cuda_keywords = ("extra_cuda_cflags", "with_cuda")
        for node in self._loads:
            keyword = next((a.keyword.value for a in node.args if a.keyword and a.keyword.value in cuda_keywords), None)
            if keyword is not None:
                why = f"it passes `{keyword}`"
            elif self._cuda_files:
                why = f"this file hands it `{string_value(self._cuda_files[0])}`"
            elif self._toolchain:
                why = "this file reads the CUDA toolchain beside it (CUDA_HOME / nvcc)"
            else:
                continue
            self.report(
                CUDA_EXTENSION,
                node,
                f"`load` builds CUDA code ({why}): port the kernels to Ascend C and build them with torch_npu's "
                "NpuExtension, or replace the extension with torch operators",
            )
        for node in self._toolchain[:1] if self._loads or self._cuda_files else ():
            code = self.ctx.code(node).strip()
            self.report(
                CUDA_EXTENSION,
                node,
                f"`{code}`: the CUDA toolchain an extension build uses; an NPU host has none (CUDA_HOME is None "
                "there): the custom kernel needs an Ascend C port",
            )

    @staticmethod
    def _builds_cuda(node: cst.Call) -> bool:
        for arg in node.args:
            values = [arg.value]
            if isinstance(arg.value, (cst.List, cst.Tuple)):
                values = [e.value for e in arg.value.elements]
            if any((string_value(v) or "").endswith((".cu", ".cuh")) for v in values):
                return True
        return False
