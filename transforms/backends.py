"""`torch.backends.cuda` / `torch.backends.cudnn`, the SDPA backend toggles and the CUDA profiler activity.

The TF32 switches have an NPU counterpart and are rewritten: `torch.backends.cuda.matmul.allow_tf32` ->
`torch.npu.matmul.allow_hf32`, `torch.backends.cudnn.allow_tf32` -> `torch.npu.conv.allow_hf32`. Everything
else under `torch.backends.cuda` and `torch.backends.cudnn` is a host-side flag that runs, and does
nothing, on NPU (or answers for CUDA): those sites are reported with what to use instead. The same holds
for the SDPA backend toggles and `torch.profiler.ProfilerActivity.CUDA`.

Names are resolved through the file's imports, so `import torch.backends.cudnn as cudnn`,
`from torch.backends import cuda` and `from torch.nn.attention import sdpa_kernel` are recognised,
while a local `allow_tf32`, `args.benchmark` or `torch.backends.mps` are not. `torch.cuda.profiler` is
rule NPU203's.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import NameUseChecker
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.imports import Binding, dotted_node
from npu_migrate.transforms.common.qualnames import with_tail

TF32_TO_HF32 = Rule(
    id="NPU501",
    name="tf32-to-hf32",
    family="backends",
    summary="`torch.backends.cuda.matmul.allow_tf32` / `cudnn.allow_tf32` become `torch.npu.matmul` / `conv.allow_hf32`",
    what="""
    Rewrites the TF32 switches to torch_npu's HF32 ones: `torch.backends.cuda.matmul.allow_tf32` ->
    `torch.npu.matmul.allow_hf32` (default off, like CUDA's matmul TF32) and
    `torch.backends.cudnn.allow_tf32` -> `torch.npu.conv.allow_hf32` (default on, like cuDNN's TF32).
    Setting and reading the flag are both rewritten; like the CUDA setters, the NPU ones take a bool.

    Uses through `torch` (any alias) are rewritten in place. A use through an import of
    `torch.backends.cuda` / `torch.backends.cudnn` (`cudnn.allow_tf32 = True`) is rewritten to
    `torch.npu...` only when the file binds `torch` at its top level no later than that import; the
    import itself is left alone. Otherwise, and for `from torch.backends.cudnn import allow_tf32` (a
    copy of the flag taken at import time), the site is reported.
    """,
    why="""
    NPUs have no TF32: the CUDA flags change nothing there. Matmuls a GPU run did in TF32 run in full
    float32 (slower), and setting `cudnn.allow_tf32 = False` no longer keeps convolutions in full
    float32 (`torch.npu.conv.allow_hf32` defaults to True). HF32 is the NPU's reduced-precision float32.
    """,
    example=Example(
        before="""
            import torch

            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        """,
        after="""
            import torch
            import torch_npu

            torch.npu.matmul.allow_hf32 = True
            torch.npu.conv.allow_hf32 = True
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    HF32 is not TF32: the NPU's reduced-precision float32 rounds differently from the GPU's, so results
    differ from the GPU run in the low bits, as TF32's differ from float32. Check the model's accuracy,
    or set the flags to False for full float32.
    """,
)

CUDNN_SETTINGS = Rule(
    id="NPU502",
    name="cudnn-settings",
    family="backends",
    summary="`torch.backends.cudnn.benchmark` / `deterministic` / `enabled` / `is_available()` ... are reported: no cuDNN on NPU",
    what="""
    Reports the `torch.backends.cudnn` flags and queries, and leaves the code as it is. `benchmark`,
    `benchmark_limit` and `enabled` can stay or go. For determinism use
    `torch.use_deterministic_algorithms(True)`, torch_npu's `torch.npu.enable_deterministic_with_backward`
    (and `torch.npu.set_deterministic_level` in newer versions), and `HCCL_DETERMINISTIC=true` for
    collectives; for availability `torch.npu.is_available()`.
    """,
    why="""
    torch_npu does not use cuDNN, so the flags run but change nothing on NPU: `deterministic = True`
    does *not* make NPU kernels deterministic. `is_available()` is False and `version()` None on NPU, so
    code gated on them takes its no-accelerator path.
    """,
    example=Example(
        before="""
            import torch

            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.deterministic = True
        """,
        reports="does not make NPU kernels deterministic",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
)

SDP_TOGGLES = Rule(
    id="NPU503",
    name="sdp-backend-toggles",
    family="backends",
    summary="SDPA backend toggles (`sdp_kernel`, `enable_flash_sdp`, `sdpa_kernel(...)` ...) select no NPU kernel and are reported",
    what="""
    Reports `torch.backends.cuda.sdp_kernel`, `enable_flash_sdp`, `enable_mem_efficient_sdp`,
    `enable_math_sdp`, their `*_sdp_enabled` queries, `torch.nn.attention.sdpa_kernel(...)` and the
    availability queries (`can_use_flash_attention`, `is_flash_attention_available` ...). The code is
    left as it is: remove or guard the toggle.
    """,
    why="""
    The toggles only flip torch's global SDPA flags; on NPU they select no kernel (torch_npu's same-named
    `torch.npu.enable_flash_sdp` says so in a warning), and the queries answer for CUDA. The NPU's fused
    attention is `torch_npu.npu_fusion_attention`, which rule NPU704 injects for
    `scaled_dot_product_attention` calls.
    """,
    example=Example(
        before="""
            import torch
            import torch.nn.functional as F


            def attend(q, k, v):
                with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False):
                    return F.scaled_dot_product_attention(q, k, v)
        """,
        reports="on NPU it selects no kernel",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
)

PROFILER_CUDA = Rule(
    id="NPU504",
    name="profiler-cuda-activity",
    family="backends",
    summary="`torch.profiler.ProfilerActivity.CUDA` is reported: NPU kernels are traced by `torch_npu.profiler`",
    what="""
    Reports `torch.profiler.ProfilerActivity.CUDA` and leaves the code as it is. Use
    `torch_npu.profiler.profile` with `activities=[torch_npu.profiler.ProfilerActivity.CPU,
    torch_npu.profiler.ProfilerActivity.NPU]` and
    `experimental_config=torch_npu.profiler._ExperimentalConfig(...)`, with `torch_npu.profiler.schedule`
    and `torch_npu.profiler.tensorboard_trace_handler`. (`torch.cuda.profiler.start/stop` are NPU203's.)
    """,
    why="""
    `ProfilerActivity.CUDA` traces CUDA kernels through CUPTI; on NPU it traces nothing. Swapping only
    the activity would not work: `torch.profiler.profile` cannot trace NPU activity.
    """,
    example=Example(
        before="""
            from torch.profiler import ProfilerActivity, profile


            def trace(model, x):
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    model(x)
                return prof
        """,
        reports="Use torch_npu.profiler.profile",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
)

CUDA_BACKEND_SETTINGS = Rule(
    id="NPU505",
    name="cuda-backend-settings",
    family="backends",
    summary="Other `torch.backends.cuda` settings (cuFFT plan cache, cuBLAS workspace, linalg library ...) are reported",
    what="""
    Reports `torch.backends.cuda.preferred_linalg_library` (a no-op on NPU), `preferred_blas_library`,
    the cuBLAS workspace settings, `matmul.allow_fp16_reduced_precision_reduction` / `allow_bf16_...` /
    `fp32_precision`, `is_built()` and `cufft_plan_cache`, and leaves the code as it is; the finding says
    what to use instead, if anything.
    """,
    why="""
    These settings have no NPU counterpart. `cufft_plan_cache` has a near one,
    `torch.npu.backends.fft_plan_cache` (`max_size`, `size`, `clear()`), but that is one cache for the
    process rather than one per device (`cufft_plan_cache[i]`), so it is not rewritten.
    """,
    example=Example(
        before="""
            import torch

            torch.backends.cuda.cufft_plan_cache.max_size = 32
        """,
        reports="torch.npu.backends.fft_plan_cache",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
)


@dataclass(frozen=True)
class Spec:
    rule: Rule
    advice: str
    severity: Severity | None = None
    target: str | None = None  # the NPU name, for the rewritten (NPU501) ones


_NO_CUDNN = (
    "has no effect on NPU, where torch_npu does not use cuDNN; the line is harmless: keep it for GPU runs or remove it."
)
_DETERMINISTIC = (
    "does not make NPU kernels deterministic (torch_npu does not use cuDNN). Use torch.use_deterministic_algorithms(True), "
    "torch_npu's torch.npu.enable_deterministic_with_backward{level}, and HCCL_DETERMINISTIC=true in the environment "
    "for deterministic collectives."
)
_SDP_TOGGLE = (
    "only flips torch's global SDPA flags; on NPU it selects no kernel (torch_npu's torch.npu.enable_flash_sdp and "
    "its siblings warn that they only set the global variable). The NPU fused attention is torch_npu.npu_fusion_attention, which rule NPU704 "
    "injects for scaled_dot_product_attention calls: remove or guard this toggle."
)
_SDP_QUERY = (
    "reports torch's global SDPA flag, not which NPU kernel runs: on NPU no SDPA backend flag selects a kernel. "
    "The NPU fused attention is torch_npu.npu_fusion_attention (rule NPU704)."
)
_SDP_CUDA_ONLY = (
    "answers for CUDA's attention kernels, so code gated on it takes its fallback path on NPU. The NPU fused "
    "attention is torch_npu.npu_fusion_attention (rule NPU704)."
)
_PROFILER = (
    "traces CUDA kernels and traces nothing on NPU; swapping only the activity would not work, since "
    "torch.profiler.profile does not trace NPU activity. Use torch_npu.profiler.profile with "
    "activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU] and "
    "experimental_config=torch_npu.profiler._ExperimentalConfig(...) (and torch_npu.profiler.schedule / "
    "tensorboard_trace_handler)."
)
_HF32_PRECISION = (
    "has no NPU counterpart; the NPU switches are torch.npu.matmul.allow_hf32 and torch.npu.conv.allow_hf32 "
    '(True for "tf32", False for "ieee").'
)

_CUDNN = "torch.backends.cudnn"
_CUDA = "torch.backends.cuda"
_MATMUL = "torch.backends.cuda.matmul.allow_tf32"
_CONV = "torch.backends.cudnn.allow_tf32"

_SPECS: dict[str, Spec] = {
    _MATMUL: Spec(
        TF32_TO_HF32,
        "HF32 matmul, off by default on NPU, like TF32 matmul on CUDA",
        target="torch.npu.matmul.allow_hf32",
    ),
    _CONV: Spec(
        TF32_TO_HF32,
        "HF32 convolution, on by default on NPU, like TF32 convolution in cuDNN",
        target="torch.npu.conv.allow_hf32",
    ),
    # -- cuDNN ------------------------------------------------------------------------------------------
    f"{_CUDNN}.benchmark": Spec(
        CUDNN_SETTINGS,
        "cuDNN's algorithm autotuning " + _NO_CUDNN,
    ),
    f"{_CUDNN}.benchmark_limit": Spec(CUDNN_SETTINGS, _NO_CUDNN),
    f"{_CUDNN}.enabled": Spec(
        CUDNN_SETTINGS,
        _NO_CUDNN + " Setting it to False switches off no NPU kernel.",
    ),
    f"{_CUDNN}.deterministic": Spec(CUDNN_SETTINGS, _DETERMINISTIC, Severity.WARNING),
    f"{_CUDNN}.is_available": Spec(
        CUDNN_SETTINGS,
        "is False on NPU (no cuDNN), so code gated on it takes its no-accelerator path; "
        "to ask for the NPU use torch.npu.is_available().",
        Severity.WARNING,
    ),
    f"{_CUDNN}.version": Spec(
        CUDNN_SETTINGS,
        "is None on NPU (no cuDNN); code that compares it fails or takes its fallback path.",
        Severity.WARNING,
    ),
    f"{_CUDNN}.flags": Spec(
        CUDNN_SETTINGS,
        "sets cuDNN flags only, which have no effect on NPU (for allow_tf32 use torch.npu.conv.allow_hf32, "
        "for determinism torch.use_deterministic_algorithms(True)).",
    ),
    f"{_CUDNN}.set_flags": Spec(
        CUDNN_SETTINGS,
        "sets cuDNN flags only, which have no effect on NPU (for allow_tf32 use torch.npu.conv.allow_hf32, "
        "for determinism torch.use_deterministic_algorithms(True)).",
    ),
    f"{_CUDNN}.fp32_precision": Spec(CUDNN_SETTINGS, _HF32_PRECISION),
    f"{_CUDNN}.conv.fp32_precision": Spec(CUDNN_SETTINGS, _HF32_PRECISION),
    f"{_CUDNN}.rnn.fp32_precision": Spec(CUDNN_SETTINGS, _HF32_PRECISION),
    # -- SDPA ----------------------------------------------------------------------------------------------
    **{
        f"{_CUDA}.{name}": Spec(SDP_TOGGLES, _SDP_TOGGLE)
        for name in (
            "sdp_kernel",
            "enable_flash_sdp",
            "enable_mem_efficient_sdp",
            "enable_math_sdp",
            "enable_cudnn_sdp",
            "allow_fp16_bf16_reduction_math_sdp",
        )
    },
    **{
        f"{_CUDA}.{name}": Spec(SDP_TOGGLES, _SDP_QUERY)
        for name in (
            "flash_sdp_enabled",
            "mem_efficient_sdp_enabled",
            "math_sdp_enabled",
            "cudnn_sdp_enabled",
            "fp16_bf16_reduction_math_sdp_allowed",
        )
    },
    **{
        f"{_CUDA}.{name}": Spec(SDP_TOGGLES, _SDP_CUDA_ONLY)
        for name in (
            "can_use_flash_attention",
            "can_use_efficient_attention",
            "can_use_cudnn_attention",
            "is_flash_attention_available",
            "is_ck_sdpa_available",
            "preferred_rocm_fa_library",
            "SDPAParams",
        )
    },
    "torch.nn.attention.sdpa_kernel": Spec(SDP_TOGGLES, _SDP_TOGGLE),
    # -- the profiler ----------------------------------------------------------------------------------
    **{
        f"{module}.ProfilerActivity.CUDA": Spec(PROFILER_CUDA, _PROFILER)
        for module in (
            "torch.profiler",
            "torch.autograd",
            "torch.autograd.profiler",
        )
    },
    # -- the rest of torch.backends.cuda -----------------------------------------------------------------
    f"{_CUDA}.cufft_plan_cache": Spec(
        CUDA_BACKEND_SETTINGS,
        "has a near NPU counterpart, torch.npu.backends.fft_plan_cache (max_size, size, clear()), but it is one cache "
        "for the process, not one per device, and cannot be indexed; not rewritten, change it by hand.",
    ),
    f"{_CUDA}.preferred_linalg_library": Spec(
        CUDA_BACKEND_SETTINGS,
        "is a no-op on NPU (torch.npu.preferred_linalg_library only warns and returns Default); remove it.",
    ),
    f"{_CUDA}.preferred_blas_library": Spec(
        CUDA_BACKEND_SETTINGS,
        "chooses between cuBLAS and cuBLASLt, which are not used on NPU; remove it.",
    ),
    **{
        f"{_CUDA}.{name}": Spec(
            CUDA_BACKEND_SETTINGS,
            "is a cuBLAS workspace setting, which has no effect on NPU; remove it.",
        )
        for name in ("cublas_workspace_size", "cublaslt_workspace_size", "blas_workspace_size")
    },
    **{
        f"{_CUDA}.matmul.{name}": Spec(
            CUDA_BACKEND_SETTINGS,
            "is a cuBLAS reduction setting with no NPU counterpart; it has no effect on NPU.",
        )
        for name in (
            "allow_fp16_reduced_precision_reduction",
            "allow_bf16_reduced_precision_reduction",
            "allow_fp16_accumulation",
        )
    },
    f"{_CUDA}.matmul.fp32_precision": Spec(CUDA_BACKEND_SETTINGS, _HF32_PRECISION),
    f"{_CUDA}.matmul": Spec(
        CUDA_BACKEND_SETTINGS,
        "the NPU's matmul settings are torch.npu.matmul, whose one flag is allow_hf32 (for allow_tf32); "
        "uses of this object are not rewritten.",
    ),
    f"{_CUDA}.is_built": Spec(
        CUDA_BACKEND_SETTINGS,
        "is False with the torch build used on NPU, so code gated on it takes its no-CUDA path; "
        "to ask for the NPU use torch.npu.is_available().",
        Severity.WARNING,
    ),
}

_GENERIC = {
    _CUDNN: Spec(CUDNN_SETTINGS, _NO_CUDNN),
    _CUDA: Spec(
        CUDA_BACKEND_SETTINGS, "has no NPU counterpart (torch_npu does not use the CUDA backend); check it by hand."
    ),
}


def _lookup(qualname: str) -> tuple[str, Spec] | None:
    """The table entry for `qualname` or its longest known prefix, and that prefix."""
    parts = qualname.split(".")
    for depth in range(len(parts), 2, -1):
        prefix = ".".join(parts[:depth])
        if prefix in _SPECS:
            return prefix, _SPECS[prefix]
    if len(parts) > 3 and ".".join(parts[:3]) in _GENERIC:
        return ".".join(parts[:4]), _GENERIC[".".join(parts[:3])]
    return None


# A finding needs a name under one of the tables' keys.
_NEEDED = name_sets([*_SPECS, *_GENERIC])


class BackendsChecker(NameUseChecker):
    rules = (TF32_TO_HF32, CUDNN_SETTINGS, SDP_TOGGLES, PROFILER_CUDA, CUDA_BACKEND_SETTINGS)
    # Every key holds one of these in a part, and the parts of a name a file uses are spelled out in it.
    # Not "backends", which transformers' `@requires(backends=...)` puts in 440 files.
    markers = ("cuda", "cudnn", "sdpa_kernel", "ProfilerActivity")

    @classmethod
    def wants(cls, index) -> bool:
        # Not `backends` alone: transformers' `@requires(backends=...)` and `torch.backends.mps` have it too.
        return index.may_name(_NEEDED)

    @classmethod
    def wants_words(cls, words) -> bool:
        return words_may_name(words, _NEEDED)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._top_level = {id(line): position for position, line in ctx.imports.top_level_imports}

    # -- the walk -----------------------------------------------------------------------------------

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))
        if id(node) in self._skip:
            return
        qualname, binding = self.ctx.resolve(node)
        if qualname is None:
            return
        found = _lookup(qualname)
        if found is None:
            return
        self._skip_chain(node.value)
        key, spec = found
        self._use(_node_for(node, key, binding), key, spec, binding)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._skip:
            return
        binding = self.ctx.imports.binding(node.value)
        if binding is None:
            return
        found = _lookup(binding.qualname)
        if found is not None:
            self._use(node, found[0], found[1], binding)

    # -- reporting ----------------------------------------------------------------------------------

    def _use(self, node: cst.BaseExpression, key: str, spec: Spec, binding: Binding) -> None:
        if spec.target is None:
            self.report(spec.rule, node, f"`{key}`: {self._advice(spec)}", severity=spec.severity)
            return
        target = spec.target
        message = f"`{key}` -> `{target}` ({spec.advice})"
        if not self.ctx.api.has_npu(target.split(".")[2]):
            self.report(
                spec.rule,
                node,
                f"`{key}`: torch_npu {self.ctx.api.version} has no `{target}`; not rewritten",
                severity=Severity.WARNING,
            )
        elif binding.qualname == "torch":
            tail = target.split(".")[1:]
            self.report(spec.rule, node, message, fix=lambda updated: _keep_parens(updated, with_tail(updated, tail)))
        elif isinstance(node, cst.Attribute) and (root := self._torch_root(binding)) is not None:
            new = dotted_node(".".join([root, *target.split(".")[1:]]))
            self.report(spec.rule, node, message, fix=lambda updated: _keep_parens(updated, new))
        else:
            why = (
                "a copy of the flag taken at import time"
                if binding.qualname == key
                else f"reached through the import of `{binding.qualname}`, and no top-level `import torch` precedes it"
            )
            self.report(
                spec.rule,
                node,
                f"`{key}`: use `{target}` on NPU ({spec.advice}); not rewritten: {why}",
                severity=Severity.WARNING,
            )

    def _advice(self, spec: Spec) -> str:
        if spec.advice is _DETERMINISTIC:
            level = (
                " (and torch.npu.set_deterministic_level)" if self.ctx.api.has_npu("set_deterministic_level") else ""
            )
            return spec.advice.format(level=level)
        return spec.advice

    def _torch_root(self, binding: Binding) -> str | None:
        """The name that reaches `torch` wherever `binding` is bound: a top-level `import torch [as th]`
        (never rebound in the file) no later than the top-level import that made `binding`."""
        position = self._top_level.get(id(binding.line))
        if position is None:
            return None
        for local, other in self.ctx.imports.bindings.items():
            if (
                other.qualname == "torch"
                and not other.is_from_import
                and "." not in local
                and self._top_level.get(id(other.line), position + 1) <= position
            ):
                return local
        return None


def _node_for(node: cst.Attribute, key: str, binding: Binding) -> cst.BaseExpression:
    """The part of the chain `node` that names `key` (`torch.backends.cudnn.benchmark` in
    `torch.backends.cudnn.benchmark.__class__`)."""
    chain: list[cst.BaseExpression] = []
    current: cst.BaseExpression = node
    while isinstance(current, cst.Attribute):
        chain.append(current)
        current = current.value
    chain.append(current)
    chain.reverse()  # root first; chain[i] names binding.qualname plus i more parts
    index = len(key.split(".")) - len(binding.qualname.split("."))
    return chain[max(0, min(index, len(chain) - 1))]


def _keep_parens(updated: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """`new` with the parentheses `updated` was written in."""
    return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)
