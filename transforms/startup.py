"""Training speed at start-up: the switches Ascend's training ports set in their entry point, and `torch.compile`.

Facts from the torch_npu wheels on PyPI, read without importing them:

* `torch.npu.set_compile_mode(jit_compile=False)` exists in every sampled version (`npu/npu_config.py`:
  2.1.0.post8 line 84, 2.5.1 line 85, 2.14.0 line 98): it sets the "jitCompile" option, so operators
  run from prebuilt binaries instead of being compiled online on first use. The default is already False
  on Atlas A2 and True on older Atlas training / inference chips (torch_npu_facts.md, "Native SDPA, fused
  optimizers, compile mode": ComfyUI PR #10050 measured the first SD1.5 image at about 600 s with jit
  compile on a 310P-class chip, about 40 s without).
* `torch.npu.config.allow_internal_format` is a setter of the "ALLOW_INTERNAL_FORMAT" option
  (`npu/npu_config.py`, class `_npuConfig`, 2.14.0 lines 150-155); Ascend's ModelZoo ports set it to False
  (private NZ / 5HD formats off) next to the compile mode.
* torch_npu registers a dynamo backend named "npu" (torchair's graph mode) on import (`dynamo/__init__.py`:
  2.1.0.post8 line 119, 2.14.0 lines 204-232).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.transforms.common.arguments import keyword
from npu_migrate.transforms.common.strings import string_value

#: The block NPU511 writes first in an entry point's `if __name__ == "__main__":`, at that block's indent.
SWITCHES = """
# npu-migrate NPU511: the start-up switches of Ascend's training ports:
# operators run from prebuilt binaries instead of being compiled on first
# use (the default on Atlas A2 already; minutes of start-up on older
# chips), and tensors stay in ND format, not the private NZ / 5HD ones.
if torch.npu.is_available():
    torch.npu.set_compile_mode(jit_compile=False)
    torch.npu.config.allow_internal_format = False
""".lstrip("\n")

STARTUP_SWITCHES = Rule(
    id="NPU511",
    name="npu-startup-switches",
    family="startup",
    summary="an entry point sets the compile mode and internal formats of Ascend's training ports (opt-in)",
    what="""
    In a file that runs as a program (a top-level `if __name__ == "__main__":`) and imports `torch`, writes
    `torch.npu.set_compile_mode(jit_compile=False)` and `torch.npu.config.allow_internal_format = False`
    first in that block, once, under `if torch.npu.is_available():` (so that a host without an NPU is not
    touched), with a comment that says why. Left alone where the file sets either already. Console-script
    targets (`[project.scripts]`) are not looked for. Not selected by `ALL`: select it by id
    (`--select ALL,NPU511`).
    """,
    why="""
    With jit compile on (the default on Atlas training chips before A2), every operator shape is compiled
    the first time it runs: the first steps take minutes. On Atlas A2 the default is already off, and the
    call changes nothing. The private formats are what Ascend's ModelZoo training ports turn off next to
    it. Both switch which kernels run, so results may differ in the last bits, and a kernel that exists
    only as an online-compiled one is slower: this is why the rule is opt-in.
    """,
    example=Example(
        before="""
            import torch


            def main():
                print(torch.ones(2))


            if __name__ == "__main__":
                main()
        """,
        after="""
            import torch
            import torch_npu


            def main():
                print(torch.ones(2))


            if __name__ == "__main__":
                # npu-migrate NPU511: the start-up switches of Ascend's training ports:
                # operators run from prebuilt binaries instead of being compiled on first
                # use (the default on Atlas A2 already; minutes of start-up on older
                # chips), and tensors stay in ND format, not the private NZ / 5HD ones.
                if torch.npu.is_available():
                    torch.npu.set_compile_mode(jit_compile=False)
                    torch.npu.config.allow_internal_format = False
                main()
        """,
    ),
    valid=(
        """
        import torch


        def main():
            print(torch.ones(2))
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    On Atlas A2 the compile mode is the default already; on older chips check that the prebuilt operator
    binaries (the CANN kernels package) are installed. An entry point that another one imports runs its
    switches only when it is the program.
    """,
    tags=frozenset({"lever", "opt-in"}),
)

TORCH_COMPILE = Rule(
    id="NPU512",
    name="torch-compile-on-npu",
    family="startup",
    summary="`torch.compile` with the default backend is reported with torch_npu's graph backend",
    what="""
    Reports `torch.compile(...)` calls and `@torch.compile` decorators whose backend is not given or is
    "inductor". Nothing is rewritten.
    """,
    why="""
    On an NPU torch.compile's default inductor backend is reported slower than eager for some models
    (sgl-project/sglang PR #20926 skips it on NPU: 6x slower for diffusion models). torch_npu registers
    the dynamo backend "npu" on import, Ascend's torchair graph mode: `torch.compile(model,
    backend="npu")`, or `torchair.get_npu_backend(compiler_config=...)` for its options. Measure both.
    """,
    example=Example(
        before="""
            import torch

            model = torch.compile(torch.nn.Linear(4, 2))
        """,
        reports='backend="npu"',
    ),
    valid=(
        """
        import torch

        model = torch.compile(torch.nn.Linear(4, 2), backend="npu")
        """,
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=frozenset({"lever"}),
)

_COMPILE_ADVICE = (
    "`torch.compile` uses inductor, which on an NPU is reported slower than eager for some models; torch_npu "
    'registers Ascend\'s torchair graph mode as the dynamo backend "npu": try `backend="npu"` '
    "(or `torchair.get_npu_backend()`) and measure"
)


_COMPILE = name_sets(["torch.compile"])


def _is_main_test(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    sides = (test.left, target.comparator)
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strings = [s for s in sides if string_value(s) == "__main__"]
    return len(names) == 1 and len(strings) == 1


class StartupChecker(Checker):
    rules = (STARTUP_SWITCHES, TORCH_COMPILE)
    markers = ("__main__", "compile")

    # Not `__name__` alone: most modules read it (`logging.getLogger(__name__)`), and parsing every one of
    # them with libcst cost a third more time on transformers' files.
    @classmethod
    def wants_words(cls, words) -> bool:
        return ("__main__" in words and "torch" in words) or words_may_name(words, _COMPILE)

    @classmethod
    def wants(cls, index) -> bool:
        # `torch.compile` as an import resolves it, not `re.compile` in a file that also imports torch (#26).
        return ("__main__" in index.strings and "torch" in index.names) or index.may_use("torch", "compile")

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._main: cst.If | None = None

    def visit_Module(self, node: cst.Module) -> None:
        for stmt in node.body:
            if isinstance(stmt, cst.If) and _is_main_test(stmt.test) and self._main is None:
                self._main = stmt

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # `@torch.compile(...)` is a call, which `visit_Call` reports.
        if self.ctx.qualname(node.decorator) == "torch.compile":
            self.report(TORCH_COMPILE, node, _COMPILE_ADVICE)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) == "torch.compile" and self._default_backend(node):
            self.report(TORCH_COMPILE, node, _COMPILE_ADVICE)

    @staticmethod
    def _default_backend(call: cst.Call) -> bool:
        backend = keyword(call, "backend")
        return backend is None or string_value(backend.value) == "inductor"

    def finish(self) -> None:
        main = self._main
        if main is None or not isinstance(main.body, cst.IndentedBlock):
            return
        text = self.ctx.text
        if "set_compile_mode" in text or "allow_internal_format" in text:
            return  # set already (or by an earlier run)
        if not self._imports_torch():
            return
        self.report(
            STARTUP_SWITCHES,
            main,
            "entry point: sets torch_npu's compile mode (prebuilt operator binaries) and ND formats on an NPU host",
            fix=_add_switches,
        )

    def _imports_torch(self) -> bool:
        for stmt in self.ctx.module.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Import) and any(
                        isinstance(a.name, cst.Name) and a.name.value == "torch" and a.asname is None
                        for a in small.names
                    ):
                        return True
        return False


def _add_switches(updated: cst.If) -> cst.If:
    block = cst.parse_module(SWITCHES)
    # libcst keeps a module's opening comments in its header, not on its first statement.
    comments = [line for line in block.header if line.comment is not None]
    statements = list(block.body)
    statements[0] = statements[0].with_changes(leading_lines=[*comments, *statements[0].leading_lines])
    body = updated.body
    return updated.with_changes(body=body.with_changes(body=[*statements, *body.body]))
