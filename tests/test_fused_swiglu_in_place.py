"""NPU702's branches in place of a statement (#23), against what a review found in them: each case is
either rewritten and computes what the original does on every host, or left alone. Every test here failed
on the first version of the rewrite (a gate moved into a comprehension or lambda, the wrong statement
replaced after a `;`, a list or a float tested for an NPU, a constant gated, a split's dim rebound, a second
run adding a branch, an untrue finding).

"forced": the migrated file with `_is_npu` forced true and the CPU reference kernels as `torch_npu` (an NPU
run); "npu host": `torch_npu` importable, the real `_is_npu`, tensors on the CPU (what an Ascend host does
with a tensor that is not on the NPU, or a value that is no tensor); "plain": the migrated file as is (CUDA).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration
TORCH_NPU = reference.torch_npu_module()
HEADER = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\n"
CLI = [sys.executable, "-m", "npu_migrate"]


#: The layers every case's module has, created where the rule reads them: `self.w1(x)` of an `nn.Linear`
#: proves `x` a tensor.
INIT = """
    def __init__(self):
        super().__init__()
        self.flag = True
        self.w1 = nn.Linear(8, 12)
        self.w3 = nn.Linear(8, 12)
        self.w2 = nn.Linear(12, 8)
        self.w13 = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(8)
"""


def _apply(tmp_path: Path, source: str, name: str = "case.py") -> tuple[str, str]:
    """(original, migrated) text of one file through `npu-migrate apply -o`."""
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir(exist_ok=True)
    text = HEADER + textwrap.dedent(source).replace("class M(nn.Module):\n", "class M(nn.Module):" + INIT + "\n", 1)
    (src / name).write_text(text, encoding="utf-8")
    done = subprocess.run([*CLI, "apply", str(src), "-o", str(out)], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    return text, (out / name).read_text(encoding="utf-8")


def _load(text: str, mode: str | None):
    namespace = {"__name__": "case"}
    exec(compile(text, "case.py", "exec"), namespace)
    if mode == "forced":
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    elif mode == "npu host":
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _mlp(namespace, **extra):
    torch.manual_seed(0)
    module = namespace["M"]()
    for name, value in extra.items():
        setattr(module, name, value)
    return module


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def _runs_as_original(tmp_path, source, call, rewritten: bool, modes=("plain", "forced", "npu host"), **extra):
    """The case is rewritten (or left alone, as `rewritten` says), and computes what the original does."""
    original, migrated = _apply(tmp_path, source)
    assert ("if _is_npu(" in migrated) == rewritten, migrated
    expected = call(_mlp(_load(original, None), **extra))
    for mode in modes:
        got = call(_mlp(_load(migrated, None if mode == "plain" else mode), **extra))
        assert _same(expected, got), f"{mode}: {got!r}"


# 1. The activation bound in front, the gate inside a comprehension: a branch would test the comprehension's
#    own variable, in front of it (NameError on every host, CUDA too). Left alone.
def test_gate_in_a_comprehension_tests_an_unbound_name(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x, ups):
            if self.flag:
                x = x * 2
            h = F.silu(self.w1(x))
            outs = [h * u for u in ups]
            return outs
    """
    x, ups = torch.randn(3, 8), [torch.randn(3, 12), torch.randn(3, 12)]
    _runs_as_original(tmp_path, source, lambda m: m(x, ups), rewritten=False)


# 2. Same join, the comprehension's variable shadows the name the activation read: silu(w1(x)) is moved
#    into the comprehension, where `x` is each element of `xs` (another number on an NPU).
def test_gate_moved_into_a_comprehension_reads_its_variable(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x, xs):
            if self.flag:
                x = x * 2
            h = F.silu(self.w1(x))
            outs = [h * self.w3(x) for x in xs]
            return outs
    """
    x, xs = torch.randn(3, 8), [torch.randn(3, 8), torch.randn(3, 8)]
    _runs_as_original(tmp_path, source, lambda m: m(x, xs), rewritten=False)


# 3. Same with a lambda: `self.w1(x)` now reads the lambda's parameter, and later.
def test_gate_moved_into_a_lambda_reads_its_parameter(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x):
            if self.flag:
                x = x * 2
            h = F.silu(self.w1(x))
            gated = lambda x: h * x
            return gated(self.w3(x))
    """
    x = torch.randn(3, 8)
    _runs_as_original(tmp_path, source, lambda m: m(x), rewritten=False)


# 4. A multi-line statement followed by `; other` earlier in the block: `_steps_to` counts distinct start
#    lines, libcst counts lines, so the branch replaces the NEXT statement (the `return`): None on an NPU.
def test_semicolon_after_a_multi_line_statement_shifts_the_replaced_statement(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x):
            if self.flag:
                x = x + 1
            residual = self.norm(
                x); x = residual
            h = F.silu(self.w1(x)) * self.w3(x)
            return self.w2(h) + residual
    """
    x = torch.randn(3, 8)
    _runs_as_original(tmp_path, source, lambda m: m(x), rewritten=True)


# 5. A `return` branch in a nested block is inserted in front of the original `return`; a second run
#    sees the original `return` again and adds another branch, every run.
def test_nested_return_branch_is_idempotent(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x, n: int):
            for i in range(n):
                if i == n - 1:
                    return self.w2(F.silu(self.w1(x)) * self.w3(x))
                x = x + 1
            return x
    """
    _, once = _apply(tmp_path, source)
    (tmp_path / "again").mkdir()
    again = tmp_path / "again" / "case.py"
    again.write_text(once, encoding="utf-8")
    subprocess.run([*CLI, "apply", str(again)], capture_output=True, text=True, check=False)
    assert again.read_text(encoding="utf-8") == once


# 6. The tested tensor is not a tensor: `xs[i]` unwrapped to the list `xs`; the up operand a float
#    parameter; the first parameter the statements read (an int). `_is_npu(v)` reads `v.device` on an
#    Ascend host (AttributeError), and a float `up` reaches `_npu_silu_mul`'s `up.shape`.
@pytest.mark.parametrize(
    ("source", "call"),
    [
        (
            """
            class M(nn.Module):
                def forward(self, xs):
                    outs = []
                    for i in range(len(xs)):
                        h = F.silu(self.w1(xs[i])) * self.w3(xs[i])
                        outs.append(self.w2(h))
                    return outs
            """,
            lambda m: m([torch.randn(3, 8), torch.randn(3, 8)]),
        ),
        (
            """
            class M(nn.Module):
                def forward(self, x, scale: float):
                    if self.flag:
                        x = x + 1
                    h = F.silu(self.w1(x)) * scale
                    return self.w2(h)
            """,
            lambda m: m(torch.randn(3, 8), 0.5),
        ),
        (
            """
            class M(nn.Module):
                def forward(self, n: int, x):
                    if self.flag:
                        x = x + 1
                    gate, up = torch.cat([self.w1(x[:n]), self.w3(x[:n])], -1).chunk(2, dim=-1)
                    h = F.silu(gate) * up
                    return self.w2(h)
            """,
            lambda m: m(2, torch.randn(3, 8)),
        ),
    ],
    ids=["list_element", "float_up", "int_parameter"],
)
def test_tested_value_is_not_a_tensor(tmp_path, source, call):
    _runs_as_original(tmp_path, source, call, rewritten=False)


# 7. A constant `up` (`silu(h) * 0.5`) becomes `_npu_silu_mul(h, 0.5)`: `0.5.shape` on an NPU. (The
#    straight-line rewrite does the same: `return self.w2(_npu_silu_mul(self.w1(x), 0.5))`.)
@pytest.mark.parametrize("flag", ["if self.flag:\n                x = x + 1\n            ", ""])
def test_constant_up_operand(tmp_path, flag):
    source = f"""
    class M(nn.Module):
        def forward(self, x):
            {flag}h = F.silu(self.w1(x)) * 0.5
            return self.w2(h)
    """
    _runs_as_original(tmp_path, source, lambda m: m(torch.randn(3, 8)), rewritten=False)


# 8. The chunk's dim read from a name rebound between the split and the gate: the kernel gets the new value.
def test_chunk_dim_rebound_between_split_and_gate(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x, dim: int = -1):
            if self.flag:
                x = x + 1
            projected = self.w13(x)
            gate, up = projected.chunk(2, dim=dim)
            dim = 0
            h = F.silu(gate) * up
            return self.w2(h), dim
    """
    _runs_as_original(tmp_path, source, lambda m: m(torch.randn(3, 8))[0], rewritten=True)


# 9. TorchScript: the original scripts; the migrated module does not (`_is_npu(Tensor x)` given a float).
def test_float_up_keeps_torchscript_working(tmp_path):
    source = """
    class M(nn.Module):
        def forward(self, x, scale: float):
            if self.flag:
                x = x + 1
            h = F.silu(self.w1(x)) * scale
            return self.w2(h)
    """
    import importlib.util

    original, migrated = _apply(tmp_path, source)
    for name, text in (("original_s10", original), ("migrated_s10", migrated)):
        path = tmp_path / f"{name}.py"
        path.write_text(text, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # TorchScript reads the class's source through its module
        spec.loader.exec_module(module)
        torch.jit.script(_mlp(vars(module)))


# 10. A finding that is not true: `h` is read only by the gate; the join is refused for the `global`.
def test_global_activation_finding_is_true(tmp_path):
    source = """
    h = None


    class M(nn.Module):
        def forward(self, x):
            global h
            if self.flag:
                x = x + 1
            h = F.silu(self.w1(x))
            out = h * self.w3(x)
            return self.w2(out)
    """
    src = tmp_path / "case.py"
    src.write_text(HEADER + textwrap.dedent(source), encoding="utf-8")
    done = subprocess.run([*CLI, "apply", str(src), "--diff", "--min-severity", "info"], capture_output=True, text=True)
    assert "is read besides the gate" not in done.stdout + done.stderr
    assert "`h`, the activated value, is declared `global`" in done.stdout + done.stderr
