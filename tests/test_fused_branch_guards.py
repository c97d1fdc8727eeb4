"""Where a fused branch tests or passes something the original may never compute, or computes otherwise:
a gate bound under a condition or in the sides of `... if ... else ...` or by a walrus in its own
statement, the list `torch.cat` takes taken for a tensor, a module helper shadowed by a local, a parameter
or a function around the caller, a number added to the scores, a bias that trains, a list shape TorchScript
cannot size in a guard. Each case runs (and scripts) where the original does and computes what it computes
(each failed on the first version of #23's NPU701 / NPU702 / NPU704 work this release, found by reviews).

Modes as in test_fused_swiglu_in_place.py: "forced" = `_is_npu` forced true and the CPU reference kernels as
`torch_npu` (an NPU run); "npu host" = `torch_npu` importable and the real `_is_npu`, tensors on the CPU (what
an Ascend host does with a value the branch tests).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration
TORCH_NPU = reference.torch_npu_module()
CLI = [sys.executable, "-m", "npu_migrate"]
#: What each case that defines a module imports.
MODULE_IMPORTS = """
import torch
import torch.nn.functional as F
from torch import nn

"""


def _apply(tmp_path: Path, source: str) -> tuple[str, str]:
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir(exist_ok=True)
    text = textwrap.dedent(source).lstrip()
    (src / "case.py").write_text(text, encoding="utf-8")
    done = subprocess.run([*CLI, "apply", str(src), "-o", str(out)], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    return text, (out / "case.py").read_text(encoding="utf-8")


def _load(text: str, mode: str | None):
    namespace = {"__name__": "case"}
    exec(compile(text, "case.py", "exec"), namespace)
    if mode == "forced":
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    elif mode == "npu host":
        namespace["torch_npu"] = TORCH_NPU
    return namespace


# -- NPU702 ---------------------------------------------------------------------------------------------

# An optional gate read in a conditional expression (`... if gate is not None else up`): a branch in place of
# the statement must not test `gate`, which may be None there (`None.device` on an NPU host).
OPTIONAL_GATE = (
    MODULE_IMPORTS
    + """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj = nn.Linear(8, 12, bias=False)

    def forward(self, x, gate=None):
        up = self.up_proj(x)
        out = (F.silu(gate.float()) * up.float()).to(up.dtype) if gate is not None else up
        return out
"""
)


@pytest.mark.parametrize("mode", ["npu host", "forced"])
def test_npu702_optional_gate_tested_in_front_of_its_condition(tmp_path, mode):
    original, migrated = _apply(tmp_path, OPTIONAL_GATE)
    x = torch.randn(3, 8)
    torch.manual_seed(0)
    expected = _load(original, None)["M"]()(x)
    torch.manual_seed(0)
    got = _load(migrated, mode)["M"]()(x)  # npu host: AttributeError: 'NoneType' object has no attribute 'device'
    assert torch.equal(got, expected)


# The same with control flow around the statement and the gate a plain name.
OPTIONAL_GATE_WITH_CONTROL_FLOW = (
    MODULE_IMPORTS
    + """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj = nn.Linear(8, 12, bias=False)

    def forward(self, x, gate=None):
        up = self.up_proj(x)
        if self.training:
            up = up * 2
        out = F.silu(gate) * up if gate is not None else up
        return out
"""
)


def test_npu702_in_place_gate_under_a_condition_control_flow(tmp_path):
    original, migrated = _apply(tmp_path, OPTIONAL_GATE_WITH_CONTROL_FLOW)
    x = torch.randn(3, 8)
    torch.manual_seed(0)
    expected = _load(original, None)["M"]()(x)
    torch.manual_seed(0)
    got = _load(migrated, "npu host")["M"]()(x)
    assert torch.equal(got, expected)


# `torch.cat(parts, -1)` takes a list first: not a tensor to test (`list.device` on an NPU host).
CAT_OF_A_LIST = (
    MODULE_IMPORTS
    + """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.w2 = nn.Linear(16, 16, bias=False)
        self.w3 = nn.Linear(16, 12, bias=False)
        self.w4 = nn.Linear(16, 12, bias=False)

    def forward(self, parts):
        a = F.silu(torch.cat(parts, -1)) * self.w2(torch.cat(parts, -1))
        return F.silu(self.w3(a)) * self.w4(a)
"""
)


def test_npu702_first_argument_of_a_torch_function_is_no_proof_of_a_tensor(tmp_path):
    original, migrated = _apply(tmp_path, CAT_OF_A_LIST)
    parts = [torch.randn(3, 8), torch.randn(3, 8)]
    torch.manual_seed(0)
    expected = _load(original, None)["M"]()(parts)
    torch.manual_seed(0)
    got = _load(migrated, "npu host")["M"]()(parts)  # AttributeError: 'list' object has no attribute 'device'
    assert torch.equal(got, expected)


# -- NPU704 ---------------------------------------------------------------------------------------------

# `max_neg_value` bound by the function itself (a local filling with -10) is not the module's helper of that
# name (the dtype's lowest): the kernel, which drops those keys, would compute something else.
SHADOWED_FILL = """
import torch
from torch import einsum, nn


def exists(val):
    return val is not None


def max_neg_value(t):
    return -torch.finfo(t.dtype).max


class Attend(nn.Module):
    def forward(self, q, k, v, mask=None):
        max_neg_value = self.fill_value  # a local that shadows the module's helper
        sim = einsum("b h i d, b h j d -> b h i j", q, k)
        if exists(mask):
            sim = sim.masked_fill(~mask, max_neg_value(sim))
        return einsum("b h i j, b h j d -> b h i d", sim.softmax(dim=-1), v)

    def fill_value(self, t):
        return -1.0
"""


def test_npu704_fill_helper_shadowed_by_a_local(tmp_path):
    original, migrated = _apply(tmp_path, SHADOWED_FILL)
    g = torch.Generator().manual_seed(0)
    q, k, v = ((0.25 * torch.randn(2, 4, 6, 16, generator=g)).half() for _ in range(3))
    keep = torch.rand(2, 1, 6, 6, generator=g) > 0.4
    keep[..., 0] = True
    expected = _load(original, None)["Attend"]()(q, k, v, keep)
    before = TORCH_NPU.calls["npu_fusion_attention"]
    got = _load(migrated, "forced")["Attend"]()(q, k, v, keep)
    ran = TORCH_NPU.calls["npu_fusion_attention"] - before
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    assert ran == 0 or cosine >= 0.999, f"kernel ran, cosine {cosine.item():.4f}"


# `exists` passed as a parameter is the caller's predicate, not the module's one-line helper: a branch that
# tests it again runs it twice per forward where the kernel declines (this one counts its calls).
SHADOWED_PREDICATE = """
import torch
from torch import einsum


def exists(val):
    return val is not None


def attend(q, k, v, mask=None, exists=exists):
    sim = einsum("b h i d, b h j d -> b h i j", q, k)
    if exists(mask):
        sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)
    return einsum("b h i j, b h j d -> b h i d", sim.softmax(dim=-1), v)
"""


def test_npu704_predicate_helper_shadowed_by_a_parameter(tmp_path):
    original, migrated = _apply(tmp_path, SHADOWED_PREDICATE)
    q, k, v = (torch.randn(2, 4, 6, 16) for _ in range(3))  # fp32: the kernel declines, the original runs
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    counts = []

    def predicate(m):
        counts.append(m)
        return m is not None

    expected = _load(original, None)["attend"](q, k, v, keep, predicate)
    calls_original = len(counts)
    counts.clear()
    got = _load(migrated, "forced")["attend"](q, k, v, keep, predicate)
    assert torch.equal(got, expected)
    assert len(counts) == calls_original, f"the caller's predicate ran {len(counts)} times, {calls_original} before"


# A gate bound only under `if self.gated:` and read under the same condition: testing it in front of the
# statement reads an unbound local on every host, CUDA included.
GATE_BOUND_UNDER_A_CONDITION = (
    MODULE_IMPORTS
    + """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Linear(8, 12, bias=False)
        self.u = nn.Linear(8, 12, bias=False)
        self.gated = False

    def forward(self, x):
        up = self.u(x)
        if self.gated:
            gate = self.g(x)
        return (F.silu(gate.float()) * up.float()).to(up.dtype) if self.gated else up
"""
)


def test_npu702_gate_bound_under_a_condition_is_tested_unbound(tmp_path):
    original, migrated = _apply(tmp_path, GATE_BOUND_UNDER_A_CONDITION)
    x = torch.randn(3, 8)
    torch.manual_seed(0)
    expected = _load(original, None)["M"]()(x)
    torch.manual_seed(0)
    got = _load(migrated, None)["M"]()(x)  # plain (a CUDA host): UnboundLocalError
    assert torch.equal(got, expected)


# A number added to the scores (`bias: float = 0.0`) is no mask tensor: `_npu_eager_attention` must run the
# original, not ask it `is_floating_point()`.
SCALAR_BIAS = """
import torch
from torch import einsum


def scalar_bias(q, k, v, bias: float = 0.0):
    sim = einsum("b h i d, b h j d -> b h i j", q, k)
    return einsum("b h i j, b h j d -> b h i d", (sim + bias).softmax(dim=-1), v)
"""


def test_npu704_number_added_to_the_scores_is_no_mask_tensor(tmp_path):
    original, migrated = _apply(tmp_path, SCALAR_BIAS)
    q, k, v = (torch.randn(2, 4, 6, 16).half() for _ in range(3))
    expected = _load(original, None)["scalar_bias"](q, k, v)
    got = _load(migrated, "forced")["scalar_bias"](q, k, v)  # AttributeError: 'float' ... 'is_floating_point'
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    assert cosine >= 0.999


# An additive term that is 0 everywhere may still be a learned bias that requires grad (BEiT's shared
# relative-position table is zero-initialised): through the kernel it would get no gradient and never train.
LEARNED_BIAS_ARGUMENT = """
import torch


def attend(q, k, v, rel_pos_bias=None):
    sim = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if rel_pos_bias is not None:
        sim = sim + rel_pos_bias
    return sim.softmax(dim=-1) @ v
"""


def test_npu704_additive_term_that_requires_grad_keeps_its_gradient(tmp_path):
    original, migrated = _apply(tmp_path, LEARNED_BIAS_ARGUMENT)
    q, k, v = (torch.randn(2, 4, 6, 16).half().requires_grad_() for _ in range(3))
    grads = []
    for text, mode in ((original, None), (migrated, "forced")):
        table = torch.zeros(1, 4, 6, 6, dtype=torch.half, requires_grad=True)
        out = _load(text, mode)["attend"](q, k, v, table)
        (out.float() * torch.arange(out.numel()).view_as(out)).sum().backward()
        grads.append(table.grad)
    assert grads[0] is not None and grads[1] is not None, "the bias gets no gradient on the kernel path"


# -- names bound by the statement itself, lists in guards, enclosing scopes ---------------------------------


def _import(path: Path, name: str):
    """A module from a file (TorchScript reads its source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# `h` bound by a walrus in the gating statement itself: testing it in front of the statement reads an unbound
# local on every host, CUDA included.
WALRUS = (
    MODULE_IMPORTS
    + """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 12, bias=False)
        self.w3 = nn.Linear(8, 12, bias=False)
        self.w4 = nn.Linear(12, 12, bias=False)
        self.w5 = nn.Linear(12, 12, bias=False)

    def forward(self, x):
        a = F.silu(self.w1(h := x * 2)) * self.w3(h)
        return F.silu(self.w4(a)) * self.w5(a)
"""
)


def test_npu702_tested_name_bound_by_the_statement_itself(tmp_path):
    original, migrated = _apply(tmp_path, WALRUS)
    x = torch.randn(3, 8)
    torch.manual_seed(0)
    expected = _load(original, None)["M"]()(x)
    torch.manual_seed(0)
    got = _load(migrated, None)["M"]()(x)  # UnboundLocalError: 'h' (a CUDA host)
    assert torch.equal(got, expected)


# A normalised shape that is a list (`[self.dim]`) with no weight: a guard `tuple([self.dim]) == ...` does not
# compile under TorchScript ("cannot statically infer the expected size of a list"), where the original does.
LIST_SHAPE = (
    MODULE_IMPORTS
    + """
class Norm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, [self.dim], eps=self.eps)
"""
)


def test_npu701_list_shape_without_weight_keeps_torchscript(tmp_path):
    _apply(tmp_path, LIST_SHAPE)
    original = _import(tmp_path / "in" / "case.py", "list_shape_in")
    torch.jit.script(original.Norm(8))  # the original scripts
    migrated = _import(tmp_path / "out" / "case.py", "list_shape_out")
    scripted = torch.jit.script(migrated.Norm(8))  # RuntimeError: cannot statically infer ... size of a list
    x = torch.randn(3, 8)
    assert torch.equal(scripted(x), original.Norm(8)(x))


# A function nested in another that binds `max_neg_value` (a closure over a fill value) reads that one first,
# not the module's: the kernel would drop keys the original scores at `fill`.
ENCLOSING_FILL = """
import torch


def max_neg_value(t):
    return -torch.finfo(t.dtype).max


def make(fill):
    def max_neg_value(t):
        return fill

    def attend(q, k, v, mask=None):
        sim = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if mask is not None:
            sim = sim.masked_fill(~mask, max_neg_value(sim))
        return sim.softmax(dim=-1) @ v

    return attend
"""


def test_npu704_fill_helper_shadowed_by_an_enclosing_function(tmp_path):
    original, migrated = _apply(tmp_path, ENCLOSING_FILL)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 16, generator=generator).half() for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=generator) > 0.3
    mask[..., 0] = True
    expected = _load(original, None)["make"](-1.0)(q.float(), k.float(), v.float(), mask)
    got = _load(migrated, "forced")["make"](-1.0)(q, k, v, mask)
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    assert cosine >= 0.999  # 0.98: the kernel dropped keys the original scores at -1.0
