"""The findings only `npu-migrate analyze` reports (NPU9xx), declared like every other rule.

NPU9xx is the analysis range: NPU0xx-NPU8xx belong to the codemod's rule families.

They are report-only and found by the analysis modes, not by the codemod's checkers (`apply` would run
them for nothing): each carries the tag "analysis", and its family is the mode that reports it. They are
rules of the one registry (`npu_migrate.engine.registry`) all the same: `npu-migrate rules NPU941` documents
them, `--select` / `--ignore` accept their ids, and every finding of an analysis report links to one.
"""

from __future__ import annotations

from collections.abc import Mapping

from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.findings import Finding, FindingData, Severity

_ANALYSIS = frozenset({"analysis"})

CUDA_ONLY_PACKAGE = Rule(
    id="NPU901",
    name="cuda-only-package",
    family="third_party",
    summary="Imports of CUDA-only packages (flash_attn, apex, xformers, bitsandbytes, ...) with the Ascend alternative",
    what="""
    Reports each import of a package listed in `transforms/data/third_party.toml`, naming the Ascend
    alternative where one exists: for example `flash_attn.flash_attn_func` ->
    `torch_npu.npu_fusion_attention`, apex `FusedAdam` -> `torch.optim.AdamW(fused=True)` or
    `torch_npu.optim.NpuFusedAdamW`. The flash-attn functions `npu-migrate apply` wraps (NPU705:
    `flash_attn_func`, varlen, packed) and xformers' `memory_efficient_attention` (NPU708) are reported
    with what apply does for them, and the hand port for the calls it does not rewrite.
    """,
    why="""
    These packages ship CUDA kernels and fail to import (or to run) on an Ascend machine.
    """,
    example=Example(
        before="""
            from flash_attn import flash_attn_func


            def attend(q, k, v):
                return flash_attn_func(q, k, v, causal=True)
        """,
        reports="`npu-migrate apply` wraps its calls (NPU705)",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    tags=_ANALYSIS,
)

UNSUPPORTED_LIBRARY_CALL = Rule(
    id="NPU902",
    name="unsupported-library-call",
    family="third_party",
    summary="Calls into a library function that reaches an unsupported API or a CUDA-only extension",
    what="""
    `analyze --mode third_party --env-path LIB` follows the library's own call graph and writes
    `full_unsupported_results.csv`; given back with `--api-files`, or in the same run, each call of the
    user's code into one of those functions is reported with the chain that makes it unsupported.
    """,
    why="""
    The user's code looks portable, but the library function it calls reaches an API or a compiled
    operator that does not exist on NPU, and fails there.
    """,
    example=Example(
        library=(
            (
                "minilib.py",
                """
                import torch


                def fused_attention(q, k, v):
                    return torch.ops.minilib.attn_fwd(q, k, v)
                """,
            ),
        ),
        before="""
            from minilib import fused_attention


            def attend(q, k, v):
                return fused_attention(q, k, v)
        """,
        reports="minilib.fused_attention is unsupported on NPU: calls the custom operator torch.ops.minilib.attn_fwd",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    tags=_ANALYSIS,
)

CUDA_KERNEL = Rule(
    id="NPU911",
    name="gpu-only-kernel-code",
    family="custom_kernels",
    summary="CUDA kernels held in Python strings, triton kernels and C++ bindings that include CUDA headers",
    what="""
    Reports a `__global__` kernel in a Python string, a triton `@triton.jit` function, and a C++ file
    that includes the CUDA runtime or ATen/c10 CUDA headers. (`.cu` files and `CUDAExtension` builds
    are the codemod's own `kernels` rules, NPU801 and NPU802.) Port each kernel to Ascend C (registered
    as an aclnn operator for torch_npu), express it with torch operators, or use triton-ascend for
    triton kernels.
    """,
    why="""
    The code runs on NVIDIA GPUs only: it cannot be compiled or launched on an NPU host.
    """,
    example=Example(
        before='''
            SRC = """
            __global__ void scale(float* x, float s, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) x[i] *= s;
            }
            """
        ''',
        reports="CUDA kernel scale (in a Python string) must be ported",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    tags=_ANALYSIS,
)

AFFINITY_API = Rule(
    id="NPU921",
    name="affinity-api",
    family="affinity_apis",
    summary="Code a torch_npu fused or affinity API can replace (fast_gelu, geglu, rotary_mul, fusion_attention, ...)",
    what="""
    Reports code a torch_npu fused kernel computes, naming the API and what to check before switching
    to it (the two differ in defaults more often than in shape): `x * torch.sigmoid(1.702 * x)` is
    `torch_npu.npu_fast_gelu(x)`; diffusers' GEGLU is `torch_npu.npu_geglu(x, dim=-1, approximate=0)[0]`
    (the default approximate=1 is the tanh GELU); `softmax(scores.masked_fill(mask, -inf))` is
    `torch_npu.npu_scaled_masked_softmax`; rotary `x * cos + rotate_half(x) * sin` is
    `torch_npu.npu_rotary_mul`; scaled_dot_product_attention is `torch_npu.npu_fusion_attention` (its
    mask is inverted: True means masked, and scale defaults to 1).
    """,
    why="""
    torch_npu ships fused kernels for patterns that are several operators in PyTorch, each a kernel
    launch and a trip through device memory on the NPU.
    """,
    example=Example(
        before="""
            import torch


            def quick_gelu(x):
                return x * torch.sigmoid(1.702 * x)
        """,
        reports="is exactly torch_npu.npu_fast_gelu(x)",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=_ANALYSIS | {"performance"},
)

DYNAMIC_SHAPE = Rule(
    id="NPU931",
    name="dynamic-shape",
    family="dynamic_shape",
    summary="Operators whose output shape depends on the data (`nonzero`, `unique`, `masked_select`, `x[mask]`)",
    what="""
    Reports operators whose output size depends on tensor values. Keep the shape static where you can
    (`torch.where(mask, x, 0)` instead of `x[mask]`, pad to buckets), or measure what shapes occur with
    `analyze --mode dynamic_shape --instrument OUT` and running the instrumented copy.
    """,
    why="""
    Ascend compiles an operator per input shape; an output whose size depends on tensor values forces
    a device-to-host sync and a recompilation for each new shape.
    """,
    example=Example(
        before="""
            import torch


            def ignored(labels, ignore_index=-100):
                return torch.nonzero(labels == ignore_index)
        """,
        reports="torch.nonzero: the output shape depends on the data",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    tags=_ANALYSIS | {"performance"},
)

VARIABLE_SHAPE_INPUT = Rule(
    id="NPU932",
    name="variable-shape-input",
    family="dynamic_shape",
    summary="Variable-length batches (collate functions padding to the longest sample) and shape-dependent control flow",
    what="""
    Reports collate functions that pad each batch to its longest sample, and `if x.shape[1] > n:` in a
    forward pass. Pad to a fixed length or a few buckets.
    """,
    why="""
    Every batch of a new shape, and every branch picked by shape, costs an operator compilation on
    Ascend.
    """,
    example=Example(
        before="""
            from torch.nn.utils.rnn import pad_sequence


            def collate(samples):
                return pad_sequence(samples, batch_first=True)
        """,
        reports="pads each batch to its longest sample",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=_ANALYSIS,
)

HOST_SYNC = Rule(
    id="NPU941",
    name="host-device-sync-in-loop",
    family="model",
    summary="`.item()`, `.cpu()`, `.numpy()`, `.tolist()`, `print(tensor)` inside a loop stall the NPU stream",
    what="""
    Reports `.item()`, `.cpu()`, `.numpy()`, `.tolist()` and `print` of a tensor computed in the loop,
    inside a loop. Log every N steps, or accumulate on the device and read once.
    """,
    why="""
    Each of these waits for every queued NPU operator to finish and copies to the host. In a training
    loop that serialises host and device.
    """,
    example=Example(
        before="""
            import torch


            def train(model, loader):
                for x, y in loader:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    print(loss.item())
        """,
        reports="loss.item() synchronises the device in every iteration of the loop at line 5",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    tags=_ANALYSIS | {"performance"},
)

DATALOADER = Rule(
    id="NPU942",
    name="dataloader-settings",
    family="model",
    summary="DataLoader settings that starve the NPU (no workers, no pinned memory)",
    what="""
    Reports `DataLoader`s without `num_workers` or `pin_memory=True`. Set `num_workers`,
    `pin_memory=True` and `persistent_workers=True`.
    """,
    why="""
    With `num_workers=0` the training process loads every batch itself between device steps, and
    without `pin_memory=True` host-to-device copies cannot overlap with compute.
    """,
    example=Example(
        before="""
            from torch.utils.data import DataLoader


            def loader(dataset):
                return DataLoader(dataset, batch_size=8)
        """,
        reports="num_workers is 0",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=_ANALYSIS | {"performance"},
)

FLOAT64 = Rule(
    id="NPU951",
    name="float64",
    family="torch_apis",
    summary="float64 tensors: most NPU kernels have no float64 implementation",
    what="""
    Reports `torch.float64` / `torch.double` tensors. Decide whether float32 is enough, or keep the
    computation on the CPU.
    """,
    why="""
    Ascend's AI cores compute in float32, float16 and bfloat16; most operators reject float64 or run on
    the AI CPU, far slower.
    """,
    example=Example(
        before="""
            import torch


            def weights(n, device):
                return torch.zeros(n, dtype=torch.float64, device=device)
        """,
        reports="most NPU kernels have no float64 implementation",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    tags=_ANALYSIS | {"precision"},
)

GELU_APPROXIMATE = Rule(
    id="NPU952",
    name="gelu-approximate",
    family="torch_apis",
    summary="`F.gelu` / `nn.GELU` on NPU always computes the tanh approximation",
    what="""
    Reports `F.gelu` and `nn.GELU`. Where exact GELU matters use
    `torch_npu.npu_gelu(x, approximate="none")` (torch_npu 2.1.0.post17 and later).
    """,
    why="""
    torch_npu's native GELU ignores `approximate` and computes the tanh form, which differs from the
    exact erf GELU (the default of `F.gelu`) by up to 5e-4.
    """,
    example=Example(
        before="""
            import torch.nn.functional as F


            def mlp(h):
                return F.gelu(h)
        """,
        reports="runs the tanh approximation on NPU",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=_ANALYSIS | {"precision"},
)

RULES = (
    CUDA_ONLY_PACKAGE,
    UNSUPPORTED_LIBRARY_CALL,
    CUDA_KERNEL,
    AFFINITY_API,
    DYNAMIC_SHAPE,
    VARIABLE_SHAPE_INPUT,
    HOST_SYNC,
    DATALOADER,
    FLOAT64,
    GELU_APPROXIMATE,
)


def finding(
    rule: Rule,
    path: str,
    line: int,
    col: int,
    message: str,
    severity: Severity | None = None,
    data: Mapping[str, str | int] | None = None,
) -> Finding:
    return Finding(rule.id, path, line, col, message, severity or rule.severity, data=FindingData.of(data))
