"""The findings only `npu-migrate analyze` reports (NPU9xx), declared like every other rule.

NPU9xx is the analysis range: NPU0xx-NPU8xx belong to the codemod's rule families.

They are report-only: nothing here rewrites code, so they are not registered with the codemod's
checkers (`apply` would run them for nothing). They still carry the `Rule` documentation, so every
finding of an analysis report links to a documented id, as the rule findings do.
"""

from __future__ import annotations

from npu_migrate.findings import Finding, Severity
from npu_migrate.rule import Rule

CUDA_ONLY_PACKAGE = Rule(
    id="NPU901",
    name="cuda-only-package",
    summary="Imports of CUDA-only packages (flash_attn, apex, xformers, bitsandbytes, ...) with the Ascend alternative",
    doc="""
    These packages ship CUDA kernels and fail to import (or to run) on an Ascend machine. The finding
    names the Ascend alternative where one exists (`transforms/data/third_party.toml`): for example
    `flash_attn.flash_attn_func` -> `torch_npu.npu_fusion_attention`, apex `FusedAdam` ->
    `torch.optim.AdamW(fused=True)` or `torch_npu.optim.NpuFusedAdamW`.

    Example:
        from flash_attn import flash_attn_func
    reports: flash_attn is CUDA-only; use torch_npu.npu_fusion_attention (sparse_mode=3 for causal=True).
    """,
    severity=Severity.ERROR,
    fixable=False,
)

UNSUPPORTED_LIBRARY_CALL = Rule(
    id="NPU902",
    name="unsupported-library-call",
    summary="Calls into a library function that reaches an unsupported API or a CUDA-only extension",
    doc="""
    `analyze --mode third_party --env-path LIB` follows the library's own call graph and writes
    `full_unsupported_results.csv`; given back with `--api-files`, each call of the user's code into one
    of those functions is reported with the chain that makes it unsupported.

    Example:
        from minilib import fused_attention
        out = fused_attention(q, k, v)
    reports: minilib.fused_attention is unsupported on NPU: minilib.layers.fused_attention calls the
    custom operator torch.ops.minilib.attn_fwd.
    """,
    severity=Severity.ERROR,
    fixable=False,
)

CUDA_KERNEL = Rule(
    id="NPU911",
    name="cuda-kernel-source",
    summary="CUDA kernels held in Python strings, triton kernels and C++ bindings that include CUDA headers",
    doc="""
    A `__global__` kernel, a triton `@triton.jit` function or a C++ file that includes the CUDA runtime
    runs on NVIDIA GPUs only. Port each kernel to Ascend C (registered as an aclnn operator for
    torch_npu), express it with torch operators, or use triton-ascend for triton kernels.

    (`.cu` files and `CUDAExtension` builds are the codemod's own `kernels` rules.)

    Example:
        SRC = "__global__ void scale_kernel(float* x, float s, int n) { ... }"
    reports: CUDA kernel scale_kernel (in a Python string) must be ported.
    """,
    severity=Severity.ERROR,
    fixable=False,
)

AFFINITY_API = Rule(
    id="NPU921",
    name="affinity-api",
    summary="Code a torch_npu fused or affinity API can replace (fast_gelu, geglu, rotary_mul, fusion_attention, ...)",
    doc="""
    torch_npu ships fused kernels for patterns that are several operators in PyTorch. The finding
    names the API and what to check before switching to it (the two differ in defaults more often
    than in shape): `x * torch.sigmoid(1.702 * x)` is `torch_npu.npu_fast_gelu(x)`; diffusers' GEGLU is
    `torch_npu.npu_geglu(x, dim=-1, approximate=0)[0]` (the default approximate=1 is the tanh GELU);
    `softmax(scores.masked_fill(mask, -inf))` is `torch_npu.npu_scaled_masked_softmax`; rotary
    `x * cos + rotate_half(x) * sin` is `torch_npu.npu_rotary_mul`; scaled_dot_product_attention is
    `torch_npu.npu_fusion_attention` (its mask is inverted: True means masked, and scale defaults to 1).

    Example:
        return x * torch.sigmoid(1.702 * x)
    reports: QuickGELU: torch_npu.npu_fast_gelu(x) computes exactly this.
    """,
    fixable=False,
)

DYNAMIC_SHAPE = Rule(
    id="NPU931",
    name="dynamic-shape",
    summary="Operators whose output shape depends on the data (`nonzero`, `unique`, `masked_select`, `x[mask]`)",
    doc="""
    Ascend compiles an operator per input shape; an output whose size depends on tensor values forces
    a device-to-host sync and a recompilation for each new shape. Keep the shape static where you can
    (`torch.where(mask, x, 0)` instead of `x[mask]`, pad to buckets), or measure what shapes occur with
    `analyze --mode dynamic_shape --instrument OUT` and running the instrumented copy.

    Example:
        idx = torch.nonzero(labels == ignore_index)
    reports: torch.nonzero: the output shape depends on the data.
    """,
    severity=Severity.WARNING,
    fixable=False,
)

VARIABLE_SHAPE_INPUT = Rule(
    id="NPU932",
    name="variable-shape-input",
    summary="Variable-length batches (collate functions padding to the longest sample) and shape-dependent control flow",
    doc="""
    A collate function that pads to the longest sequence of each batch gives every batch a new
    shape, and `if x.shape[1] > n:` in a forward pass picks the graph by shape; on Ascend each new
    shape costs an operator compilation. Pad to a fixed length or a few buckets.

    Example:
        return pad_sequence(samples, batch_first=True)
    reports: collate pads to the longest sample; batches get a new shape each time.
    """,
    fixable=False,
)

HOST_SYNC = Rule(
    id="NPU941",
    name="host-device-sync-in-loop",
    summary="`.item()`, `.cpu()`, `.numpy()`, `.tolist()`, `print(tensor)` inside a loop stall the NPU stream",
    doc="""
    Each of these waits for every queued NPU operator to finish and copies to the host. In a training
    loop that serialises host and device; log every N steps, or accumulate on the device and read once.

    Example:
        for batch in loader:
            print(loss.item())
    reports: loss.item() synchronises the device in every iteration of the loop at line 1.
    """,
    severity=Severity.WARNING,
    fixable=False,
)

DATALOADER = Rule(
    id="NPU942",
    name="dataloader-settings",
    summary="DataLoader settings that starve the NPU (no workers, no pinned memory)",
    doc="""
    With `num_workers=0` the training process loads every batch itself between device steps, and
    without `pin_memory=True` host-to-device copies cannot overlap with compute. Set `num_workers`,
    `pin_memory=True` and `persistent_workers=True`.

    Example:
        DataLoader(dataset, batch_size=8)
    reports: DataLoader without num_workers (0: loads in the training process), without pin_memory.
    """,
    fixable=False,
)

FLOAT64 = Rule(
    id="NPU951",
    name="float64",
    summary="float64 tensors: most NPU kernels have no float64 implementation",
    doc="""
    Ascend's AI cores compute in float32, float16 and bfloat16; most operators reject float64 or run on
    the AI CPU, far slower. Decide whether float32 is enough, or keep the computation on the CPU.

    Example:
        weights = torch.zeros(n, dtype=torch.float64, device=device)
    reports: torch.float64 on the device.
    """,
    severity=Severity.WARNING,
    fixable=False,
)

GELU_APPROXIMATE = Rule(
    id="NPU952",
    name="gelu-approximate",
    summary="`F.gelu` / `nn.GELU` on NPU always computes the tanh approximation",
    doc="""
    torch_npu's native GELU ignores `approximate` and computes the tanh form, which differs from the
    exact erf GELU (the default of `F.gelu`) by up to 5e-4. Where exact GELU matters use
    `torch_npu.npu_gelu(x, approximate="none")` (torch_npu 2.1.0.post17 and later).

    Example:
        h = F.gelu(h)
    reports: F.gelu runs the tanh approximation on NPU.
    """,
    fixable=False,
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

#: Which analysis mode reports each rule: the category of the report's charts.
FAMILY = {
    "NPU901": "third_party",
    "NPU902": "third_party",
    "NPU911": "custom_kernels",
    "NPU921": "affinity_apis",
    "NPU931": "dynamic_shape",
    "NPU932": "dynamic_shape",
    "NPU941": "model",
    "NPU942": "model",
    "NPU951": "torch_apis",
    "NPU952": "torch_apis",
}


def documented_rules() -> list[Rule]:
    """Every rule a report may cite: the codemod's and the analysis-only ones."""
    from npu_migrate.registry import all_rules

    return sorted([*all_rules(), *RULES], key=lambda r: r.id)


def category(rule_id: str) -> str:
    if rule_id in FAMILY:
        return FAMILY[rule_id]
    from npu_migrate.registry import family_of

    try:
        return family_of(rule_id)
    except KeyError:
        return "other"


def finding(rule: Rule, path: str, line: int, col: int, message: str, severity: Severity | None = None) -> Finding:
    return Finding(rule.id, path, line, col, message, severity or rule.severity)
