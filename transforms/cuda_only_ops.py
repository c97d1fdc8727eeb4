"""NPU203 for torch's own CUDA-only operators: ops torch builds a CUDA kernel for and no NPU one.

`torch._scaled_mm` (an fp8 matmul on cuBLASLt), `torch._scaled_grouped_mm`, `torch._cslt_sparse_mm`
(cuSPARSELt 2:4 sparsity) and the int4 packed matmul of tinygemm (`torch._weight_int4pack_mm` with its
packing op `torch._convert_weight_to_int4pack`; the CPU has `_for_cpu` twins of its own) are reached as
`torch.X` or `torch.ops.aten.X` (with an overload such as `.default`). Nothing computes the same on an NPU
under that name, so the call is reported where it is, never rewritten, and a guard in front of it is not
flipped (`npu_migrate.program.guards` reads these reports as code that crashes there).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.checkers import Checker
from npu_migrate.findings import Severity
from npu_migrate.program.guards import CUDA_ONLY_OPS, cuda_only_op
from npu_migrate.transforms.cuda_api import NO_EQUIVALENT

_TAILS = frozenset(name.rsplit(".", 1)[1] for name in CUDA_ONLY_OPS)


class CudaOnlyOpChecker(Checker):
    rules = (NO_EQUIVALENT,)
    markers = ("_scaled_mm", "_scaled_grouped_mm", "_cslt_sparse_mm", "int4pack")

    @classmethod
    def wants(cls, index) -> bool:
        return index.uses(*_TAILS)

    @classmethod
    def wants_words(cls, words) -> bool:
        return not _TAILS.isdisjoint(words)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._inner: set[int] = set()  # `torch.ops.aten.X` inside `torch.ops.aten.X.default`: one finding

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if id(node) in self._inner:
            return
        op = cuda_only_op(self.ctx.qualname(node))
        if op is None:
            return
        if isinstance(node.value, cst.Attribute):
            self._inner.add(id(node.value))
        self.report(
            NO_EQUIVALENT,
            node,
            f"`{self.ctx.code(node).strip()}` is a CUDA-only torch op, with no NPU kernel: {CUDA_ONLY_OPS[op]}",
            severity=Severity.ERROR,
            crashes=True,
        )
