"""`torch.cuda.*` APIs: renamed to `torch.npu.*` where torch_npu has them, reported where it does not.

Driven by the per-version tables in `data/torch_npu_api.toml` (generated from the torch_npu wheels) and
the hand-kept renames and advice in `data/cuda_api.toml`. Names are resolved through the file's imports,
so `import torch as th`, `from torch import cuda`, `import torch.cuda as tc` and
`from torch.cuda import synchronize as sync` are all recognised, while `torch.version.cuda`, a local
variable called `cuda` or an `args.cuda` flag are not.
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.api import ACCELERATOR_TYPE, Kind
from npu_migrate.program.imports import Binding
from npu_migrate.transforms.common.accelerator import accelerator_module, portable
from npu_migrate.transforms.common.qualnames import is_under, with_tail

SAME_NAME = Rule(
    id="NPU201",
    name="torch-cuda-api",
    family="cuda_api",
    summary="`torch.cuda.X` becomes `torch.npu.X` where the chosen torch_npu version has X",
    what="""
    Rewrites `torch.cuda.X` (however torch is imported) to `torch.npu.X` for the names torch_npu
    registers under the same name: device management, streams, events, memory statistics, RNG, graphs,
    the legacy `torch.cuda.FloatTensor` types. Which names exist depends on the torch_npu version
    (`--torch-npu-version`). Imports are rewritten in place and keep their local names, so the code
    that uses them is untouched. With `--target portable`: `torch.accelerator.X` where the chosen torch
    version (`--torch-version`) has it and it behaves as torch.cuda's; otherwise, where this rule would write
    `torch.npu.X`, `ACCELERATOR_MODULE.X` (`torch.get_device_module(ACCELERATOR)`, defined once after the
    imports): torch.cuda itself on a CUDA host and on one without accelerator, torch.npu on an Ascend host;
    `get_device_properties(...).total_memory` / `.name` are read from it too.
    """,
    why="""
    `torch.cuda` talks to the CUDA runtime, which an NPU host does not have; torch_npu registers
    `torch.npu` with the same API for the NPU.
    """,
    example=Example(
        before="""
            import torch
            from torch.cuda import synchronize as sync


            def setup(local_rank):
                torch.cuda.set_device(local_rank)
                sync()
                return torch.cuda.max_memory_allocated()
        """,
        after="""
            import torch
            import torch_npu
            from torch.npu import synchronize as sync


            def setup(local_rank):
                torch.npu.set_device(local_rank)
                sync()
                return torch.npu.max_memory_allocated()
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)

RENAMED = Rule(
    id="NPU202",
    name="torch-cuda-renamed-api",
    family="cuda_api",
    summary="CUDA APIs whose NPU counterpart has another name (`CUDAGraph` -> `NPUGraph`, nvtx -> mstx)",
    what="""
    Rewrites the APIs that are the same operation under another name: `torch.cuda.CUDAGraph` ->
    `torch.npu.NPUGraph`, `CUDAPluggableAllocator` -> `NPUPluggableAllocator`,
    `torch.cuda.OutOfMemoryError` -> `torch.OutOfMemoryError`, and `torch.cuda.nvtx.range_push`,
    `range_pop`, `mark` -> `torch.npu.mstx.*`.
    """,
    why="""
    A plain `torch.cuda` -> `torch.npu` rename names APIs that do not exist: Huawei's msFmkTransplt
    writes `torch.npu.CUDAGraph` and `torch.npu.nvtx`, which fail on first use.
    """,
    example=Example(
        before="""
            import torch

            graph = torch.cuda.CUDAGraph()
            torch.cuda.nvtx.range_push("forward")
        """,
        after="""
            import torch
            import torch_npu

            graph = torch.npu.NPUGraph()
            torch.npu.mstx.range_push("forward")
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)

NO_EQUIVALENT = Rule(
    id="NPU203",
    name="torch-cuda-no-equivalent",
    family="cuda_api",
    summary="`torch.cuda` APIs with no NPU counterpart (in the chosen torch_npu version) are reported",
    what="""
    Reports `torch.cuda` APIs that have no NPU counterpart in the chosen torch_npu version:
    `torch.cuda.nccl`, `jiterator`, `nvtx.range`, `get_arch_list`, the CUDA profiler API, and names added
    in later torch_npu versions than the one targeted; and torch's own CUDA-only ops (`torch._scaled_mm`,
    `torch._cslt_sparse_mm`, the int4 packed matmul `torch._weight_int4pack_mm`, also as
    `torch.ops.aten.X`). The finding says what to use instead. With
    `--target portable` also the names NPU201 cannot write there: a use through an import of torch.cuda
    (`from torch.cuda import manual_seed`), or a torch older than 2.7.
    """,
    why="""
    There is nothing to rename them to: the call fails on an NPU host until a human replaces it.
    """,
    example=Example(
        before="""
            import torch


            def all_reduce(tensors):
                torch.cuda.nccl.all_reduce(tensors)
        """,
        reports="use torch.distributed collectives with the hccl backend",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    targets=EVERY_TARGET,
)

BEHAVIOUR_DIFFERS = Rule(
    id="NPU204",
    name="torch-cuda-behaviour-differs",
    family="cuda_api",
    summary="APIs that exist on NPU but behave differently (`get_device_capability` returns None) are reported",
    what="""
    Reports `torch.cuda` APIs whose `torch.npu` namesake runs but answers differently:
    `torch.npu.get_device_capability()` returns None, `get_device_properties()` has no `major` /
    `minor`, float64 tensor types are mostly unsupported. Also `torch.version.cuda` read in a test
    (`if torch.version.cuda and ...: dtype = torch.bfloat16`): it is None on an NPU host, so the feature
    is silently off. The code is left as it is; the finding explains what to do.
    """,
    why="""
    A rename would run and give wrong answers: `get_device_capability()[0] >= 8` crashes on NPU.
    """,
    example=Example(
        before="""
            import torch

            use_bf16 = torch.cuda.get_device_capability()[0] >= 8
        """,
        reports="returns None on NPU",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    tags=frozenset({"precision"}),
    targets=EVERY_TARGET,
)

UNKNOWN_API = Rule(
    id="NPU205",
    name="torch-cuda-unknown-api",
    family="cuda_api",
    summary="`torch.cuda` names npu-migrate does not know (private or newer APIs) are reported",
    what="""
    Reports a `torch.cuda` name that is neither in torch's public `torch.cuda` API nor in torch_npu (for
    example the private `torch.cuda._lazy_init`), and leaves it alone.
    """,
    why="""
    npu-migrate cannot tell whether `torch.npu` has it or what it does there, so a human must decide.
    """,
    example=Example(
        before="""
            import torch

            torch.cuda._lazy_init()
        """,
        reports="not a public torch.cuda API known to npu-migrate",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    targets=EVERY_TARGET,
)

CAPABILITY = Rule(
    id="NPU206",
    name="device-capability-gate",
    family="cuda_api",
    summary="`torch.cuda.get_device_capability()` becomes `(torch.npu.get_device_capability() or (8, 0))`",
    what="""
    Rewrites a call of `torch.cuda.get_device_capability(...)` to
    `(torch.npu.get_device_capability(...) or (8, 0))`: the NPU answers as an Ampere-class GPU. Every
    use of the answer keeps working: indexing (`[0] >= 8`), tuple comparison (`>= (8, 0)`), unpacking
    (`major, minor = ...`), `major * 10 + minor`. Only calls reached through `torch` are rewritten; a
    reference to the function (`f = torch.cuda.get_device_capability`) or an import of it is reported
    (NPU204).
    """,
    why="""
    torch_npu's `get_device_capability()` returns None (unless `TORCH_NPU_DEVICE_CAPABILITY` is set,
    torch_npu 2.13+), so `torch.npu.get_device_capability()[0] >= 7` raises TypeError. Capability gates
    choose features: (8, 0) turns on what an Ascend 910B-class device has (fp16, bf16) and keeps off what
    it has not (fp8 and Hopper-only paths, `>= (8, 9)` / `>= 9`). TF32 switches are NPU501's (HF32).
    """,
    example=Example(
        before="""
            import torch

            use_bf16 = torch.cuda.get_device_capability(0)[0] >= 8
        """,
        after="""
            import torch
            import torch_npu

            use_bf16 = (torch.npu.get_device_capability(0) or (8, 0))[0] >= 8
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The gate now chooses what an Ampere-class GPU gets. Check that the features it turns on run on your
    NPU, and set `TORCH_NPU_DEVICE_CAPABILITY` (torch_npu 2.13+) where you want the NPU to answer
    something else.
    """,
)

#: What an NPU answers in place of None: an Ampere-class GPU (fp16 and bf16 yes, fp8 and Hopper paths no).
NPU_CAPABILITY = (8, 0)
#: Device properties torch_npu's `get_device_properties()` has under the same name as CUDA's.
SAME_PROPERTIES = frozenset({"name", "total_memory"})
#: Tests of whether CUDA is there: rewritten, they decide whether the code after them runs on an NPU host.
GUARDS = frozenset({"torch.cuda.is_available", "torch.cuda.device_count"})

_KIND_RULE = {Kind.MISSING: NO_EQUIVALENT, Kind.CAVEAT: BEHAVIOUR_DIFFERS, Kind.UNKNOWN: UNKNOWN_API}


def _chain(node: cst.BaseExpression) -> tuple[cst.BaseExpression, list[cst.Attribute]]:
    """Split `a.b.c` into its root expression and the Attribute nodes from the root outwards."""
    attrs: list[cst.Attribute] = []
    while isinstance(node, cst.Attribute):
        attrs.append(node)
        node = node.value
    attrs.reverse()
    return node, attrs


# Every finding is about a name under torch.cuda (through the file's imports).
_TORCH_CUDA = name_sets(["torch.cuda"])


class CudaApiChecker(Checker):
    rules = (SAME_NAME, RENAMED, NO_EQUIVALENT, BEHAVIOUR_DIFFERS, UNKNOWN_API, CAPABILITY)
    markers = ("cuda",)

    @classmethod
    def wants(cls, index) -> bool:
        return index.may_name(_TORCH_CUDA)

    @classmethod
    def wants_words(cls, words) -> bool:
        return words_may_name(words, _TORCH_CUDA)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self.api = ctx.api
        self._version_reported: set[int] = set()
        # Functions called with a keyword argument: torch.accelerator's take their device positionally only.
        self._keyword_calls: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        if any(arg.keyword is not None for arg in node.args):
            self._keyword_calls.add(id(node.func))
        # `torch.cuda.get_device_capability(0)`: a call, rewritten whole (the answer may be None on NPU).
        if self.ctx.claimed(node.func) or CAPABILITY.id not in self.enabled:
            return
        qualname, binding = self._through_torch(node.func)
        if qualname == "torch.cuda.get_device_capability":
            self._claim_chain(node.func)
            self.report(
                CAPABILITY,
                node,
                f"`{qualname}()` returns None on NPU: asked as an Ampere-class GPU, {NPU_CAPABILITY}",
                fix=_capability_or_ampere,
                crashes=True,
            )

    def _same_properties(self, func: cst.BaseExpression, attribute: str) -> None:
        """`torch.cuda.get_device_properties(...).total_memory` (or `.name`): torch.npu's has it. The portable
        target asks the accelerator's module, which is torch.cuda itself wherever the accelerator is "cuda"."""
        if portable(self.ctx) is None:
            module: cst.BaseExpression | None = None
            fix = lambda updated: with_tail(updated, ["npu", "get_device_properties"])  # noqa: E731
            target = "torch.npu"
        else:
            module = accelerator_module(self.ctx, self.enabled)
            if module is None:
                return  # reported as a use of torch.cuda.get_device_properties (NPU204)
            fix = lambda updated: cst.Attribute(value=module, attr=cst.Name("get_device_properties"))  # noqa: E731
            target = cst.Module(body=[]).code_for_node(module)
        self._claim_chain(func)
        self.report(
            SAME_NAME,
            func,
            f"`torch.cuda.get_device_properties(...).{attribute}` -> `{target}`, which has it",
            fix=fix,
            crashes=True,
        )

    def _through_torch(self, func: cst.BaseExpression) -> tuple[str | None, Binding | None]:
        """The qualified name of a chain reached through `torch` itself (not an import from torch.cuda)."""
        qualname, binding = self.ctx.resolve(func)
        if binding is not None and is_under(binding.qualname, "torch.cuda"):
            return None, None
        return qualname, binding

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if (
            node.attr.value in SAME_PROPERTIES
            and isinstance(node.value, cst.Call)
            and SAME_NAME.id in self.enabled
            and self._through_torch(node.value.func)[0] == "torch.cuda.get_device_properties"
        ):
            # `.total_memory` and `.name` exist on NPU; only major / minor / multi_processor_count do not.
            self._same_properties(node.value.func, node.attr.value)
        self.ctx.claim(node.attr)  # `x.cuda`: the attribute name is not a use of an imported `cuda`
        if self.ctx.claimed(node):
            return
        qualname, binding = self.ctx.resolve(node)
        if qualname is None:
            shadowed = self.ctx.imports.shadowed_root(node)
            if shadowed and shadowed.startswith("torch.cuda."):
                self._claim_chain(node)
                self.report(
                    UNKNOWN_API,
                    node,
                    f"`{self.ctx.code(node)}` looks like {shadowed} but its name is also rebound in this file; "
                    "not rewritten, check it by hand",
                )
            return
        if not qualname.startswith("torch.cuda."):
            return
        self._claim_chain(node)
        self._use(node, qualname, binding)

    def visit_Name(self, node: cst.Name) -> None:
        # A name imported from torch.cuda used on its own (`sync()` after `from torch.cuda import synchronize as sync`).
        binding = self.ctx.imports.binding(node.value)
        if binding is None or not is_under(binding.qualname, "torch.cuda") or self.ctx.claimed(node):
            return
        self._use(node, binding.qualname, binding)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.ctx.claim(node.keyword)

    # -- `torch.version.cuda` deciding a feature -----------------------------------------------------------

    def visit_If(self, node: cst.If) -> None:
        self._version_tests(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._version_tests(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._version_tests(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._version_tests(node.test)

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        self._version_tests(node)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self._version_tests(node)

    def _version_tests(self, test: cst.BaseExpression) -> None:
        """Report `torch.version.cuda` read in a test: None on an NPU host, so the feature it gates is off there."""
        if BEHAVIOUR_DIFFERS.id not in self.enabled:
            return
        found: list[cst.Attribute] = []
        ctx = self.ctx

        class _Reads(cst.CSTVisitor):
            def visit_Attribute(self, node: cst.Attribute) -> bool:
                if node.attr.value == "cuda" and ctx.qualname(node) == "torch.version.cuda":
                    found.append(node)
                    return False
                return True

        test.visit(_Reads())
        fresh = [node for node in found if id(node) not in self._version_reported]
        self._version_reported.update(id(node) for node in found)
        if fresh:  # once per test: `torch.version.cuda and int(torch.version.cuda[:2]) >= 11` is one decision
            self.report(
                BEHAVIOUR_DIFFERS,
                fresh[0],
                "`torch.version.cuda` is None on an NPU host, so what this test enables (bf16, a fused path) is "
                "silently off there: ask the device instead, `torch.npu.is_bf16_supported()` for bf16 (True on "
                "Ascend 910B-class devices), or test `torch.npu.is_available()` for the NPU path",
                severity=Severity.WARNING,
            )

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        # Names inside import statements are not uses; the import is rewritten through its binding.
        self._claim_chain(node.name)
        if node.asname is not None:
            self.ctx.claim(node.asname.name)

    def _claim_chain(self, node: cst.BaseExpression) -> None:
        while isinstance(node, cst.Attribute):
            self.ctx.claim(node)
            node = node.value
        self.ctx.claim(node)

    def _use(self, node: cst.BaseExpression, qualname: str, binding: Binding | None) -> None:
        mapping = self.api.map_cuda(qualname)
        if mapping.kind is Kind.OWNED:
            # `import torch.cuda as tc; tc.amp.autocast()`: the import must stay for the owning family's
            # rewrite; an import of the owned module itself (`from torch.cuda.amp import x`) is theirs.
            if (
                binding is not None
                and is_under(binding.qualname, "torch.cuda")
                and self.api.map_cuda(binding.qualname).kind is not Kind.OWNED
            ):
                self.ctx.veto(binding, f"`{qualname}` is migrated by another rule family")
            return
        if mapping.kind is Kind.DEVICE_MODULE:
            self._device_module(node, qualname, binding)
            return
        if mapping.kind in _KIND_RULE:
            rule = _KIND_RULE[mapping.kind]
            self.report(rule, node, f"`{qualname}`: {mapping.advice}", crashes=True)
            if binding is not None and is_under(binding.qualname, "torch.cuda"):
                self.ctx.veto(binding, f"`{qualname}` has no direct NPU counterpart")
            return
        rule = RENAMED if mapping.kind is Kind.RENAMED else SAME_NAME
        target = mapping.target
        if portable(self.ctx) is not None and id(node) in self._keyword_calls:
            if self._to_device_module(node, qualname, binding):  # torch.cuda's own signature on CUDA
                return
            self.report(
                rule,
                node,
                f"`{qualname}` left as is: it is called with a keyword argument, and `{target}` takes its "
                "arguments positionally only; pass them positionally and rewrite it",
                severity=Severity.WARNING,
                crashes=True,
            )
            if binding is not None and is_under(binding.qualname, "torch.cuda"):
                self.ctx.veto(binding, f"`{qualname}` is called with a keyword argument")
            return
        if rule.id not in self.enabled:
            if binding is not None and is_under(binding.qualname, "torch.cuda"):
                self.ctx.veto(binding, f"rule {rule.id} is not selected")
            return
        if binding is None or not is_under(binding.qualname, "torch.cuda"):
            # Reached through `torch` itself: rewrite the attribute chain at the use site.
            root_parts = len(binding.qualname.split(".")) if binding else 1
            tail = target.split(".")[root_parts:]
            self.report(
                rule,
                node,
                f"`{qualname}` -> `{target}`",
                fix=lambda updated, t=tail: with_tail(updated, t),
                guard=qualname in GUARDS,
                crashes=True,
            )
            return
        # Reached through an import of torch.cuda (or a name from it): the import is rebound, and the use
        # site only changes if the names below the import differ.
        bound_target = self.api.map_cuda(binding.qualname)
        if bound_target.kind not in (Kind.SAME, Kind.RENAMED):
            self.ctx.veto(binding, f"`{binding.qualname}` has no direct NPU counterpart")
            return
        self.ctx.rebind(rule, binding, bound_target.target, guard=binding.qualname in GUARDS)
        old_tail = qualname.split(".")[len(binding.qualname.split(".")) :]
        new_tail = target.split(".")[len(bound_target.target.split(".")) :]
        if bound_target.target.split(".") + new_tail != target.split("."):
            self.ctx.veto(binding, f"`{qualname}` maps to `{target}`, outside what the import can provide")
        elif old_tail != new_tail:
            self.report(
                rule,
                node,
                f"`{qualname}` -> `{target}`",
                requires=binding,
                fix=lambda updated, t=new_tail: with_tail(updated, t),
                guard=qualname in GUARDS,
                crashes=True,
            )

    def _device_module(self, node: cst.BaseExpression, qualname: str, binding: Binding | None) -> None:
        """`torch.cuda.X` -> `ACCELERATOR_MODULE.X` (the portable target, where torch.accelerator has no X that
        behaves the same), or a finding that says what to write where the file cannot have it."""
        if self._to_device_module(node, qualname, binding):
            return
        tail = self.api.device_module_tail(qualname)
        through_import = binding is not None and is_under(binding.qualname, "torch.cuda")
        why = (
            "it is reached through an import of torch.cuda"
            if through_import
            else f"rule {SAME_NAME.id} is not selected"
            if SAME_NAME.id not in self.enabled
            else "this file does not import torch"
        )
        self.report(
            NO_EQUIVALENT,
            node,
            f"`{qualname}` left as is ({why}): `torch.get_device_module(ACCELERATOR).{tail}`, with "
            f"`ACCELERATOR = {ACCELERATOR_TYPE}`, is "
            f"`{qualname}` on every host but an Ascend one, and `torch.npu.{tail}` there",
            crashes=True,
        )
        if through_import:
            self.ctx.veto(binding, f"`{qualname}` is reached through the accelerator's module")

    def _to_device_module(self, node: cst.BaseExpression, qualname: str, binding: Binding | None) -> bool:
        """Rewrite `torch.cuda.X` to the accelerator's module (torch.cuda.X itself where the accelerator's type
        is "cuda", the npu target's torch.npu.X on an Ascend host), if this file can say it: whether it did."""
        tail = self.api.device_module_tail(qualname)
        module = accelerator_module(self.ctx, self.enabled)
        through_import = binding is not None and is_under(binding.qualname, "torch.cuda")
        if tail is None or module is None or through_import or SAME_NAME.id not in self.enabled:
            return False

        def fix(updated: cst.BaseExpression) -> cst.BaseExpression:
            expr = module
            for name in tail.split("."):
                expr = cst.Attribute(value=expr, attr=cst.Name(name))
            return expr

        self.report(
            SAME_NAME,
            node,
            f"`{qualname}` -> `{cst.Module(body=[]).code_for_node(module)}.{tail}`, the accelerator's module: "
            f"torch.accelerator has no `{tail}` that behaves the same",
            fix=fix,
            guard=qualname in GUARDS,
            crashes=True,
        )
        return True

    def finish(self) -> None:
        # Imports from torch.cuda that nothing else touched still move to torch.npu.
        for binding in self.ctx.imports.bindings.values():
            if not is_under(binding.qualname, "torch.cuda"):
                continue
            mapping = self.api.map_cuda(binding.qualname)
            if mapping.kind in (Kind.SAME, Kind.RENAMED):
                rule = RENAMED if mapping.kind is Kind.RENAMED else SAME_NAME
                if rule.id in self.enabled:
                    self.ctx.rebind(rule, binding, mapping.target, guard=binding.qualname in GUARDS)
            elif mapping.kind in _KIND_RULE or mapping.kind is Kind.DEVICE_MODULE:
                self.ctx.veto(binding, f"`{binding.qualname}` has no direct NPU counterpart")
                rule = _KIND_RULE.get(mapping.kind, NO_EQUIVALENT)
                self.report(rule, binding.line, f"`{binding.qualname}`: {mapping.advice}")


def _capability_or_ampere(call: cst.Call) -> cst.BaseExpression:
    """`torch.cuda.get_device_capability(i)` -> `(torch.npu.get_device_capability(i) or (8, 0))`."""
    npu_call = call.with_changes(func=with_tail(call.func, ["npu", "get_device_capability"]), lpar=[], rpar=[])
    major, minor = NPU_CAPABILITY
    fallback = cst.Tuple([cst.Element(cst.Integer(str(major))), cst.Element(cst.Integer(str(minor)))])
    return cst.BooleanOperation(
        left=npu_call,
        operator=cst.Or(),
        right=fallback,
        lpar=call.lpar or [cst.LeftParen()],
        rpar=call.rpar or [cst.RightParen()],
    )
