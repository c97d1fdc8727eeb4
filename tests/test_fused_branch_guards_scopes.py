"""More places a fused branch must not test or read what the original does not: a tensor bound by a walrus
in the gating statement itself (NPU702), a list as the normalised shape with no weight (NPU701: TorchScript
cannot size `tuple([d])` in the guard), a module helper shadowed by a function around the one that calls
it (NPU704). Each case runs, scripts and computes as the original (each failed on the session's first
version of these rewrites, found by a review).

Modes as in test_fused_branch_guards.py: "forced" = `_is_npu` forced true and the CPU reference kernels as
`torch_npu` (an NPU run); None = the migrated code as a CUDA host runs it (`torch_npu` not importable).
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
    return namespace


def _import(path: Path, name: str):
    """A module from a file (TorchScript reads its source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 1. (newly reachable through 8996680's `_in_place_or`: this straight-line function gating twice was declined
#    before; the same holds on the control-flow path) `_tested_tensor` takes `h` from `self.w3(h)`, but `h` is
#    bound by a walrus inside the very statement the branch goes in front of: `if _is_npu(h):` raises
#    UnboundLocalError on every host, CUDA included.
WALRUS = """
import torch
import torch.nn.functional as F
from torch import nn


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


def test_npu702_tested_name_bound_by_the_statement_itself(tmp_path):
    original, migrated = _apply(tmp_path, WALRUS)
    x = torch.randn(3, 8)
    torch.manual_seed(0)
    expected = _load(original, None)["M"]()(x)
    torch.manual_seed(0)
    got = _load(migrated, None)["M"]()(x)  # UnboundLocalError: 'h' (a CUDA host)
    assert torch.equal(got, expected)


# 2. (new in 69260a7) A normalised shape that is a *list* of pure elements (`[self.dim]`, or `[8]`) is now
#    accepted; without a weight the branch guards it as `tuple([self.dim]) == x.shape[-1:]`, which TorchScript
#    cannot compile ("cannot statically infer the expected size of a list"). The original scripts; before
#    69260a7 the site was declined. (`(self.dim,)` scripts: `tuple((self.dim,))` is fine.)
LIST_SHAPE = """
import torch
import torch.nn.functional as F
from torch import nn


class Norm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, [self.dim], eps=self.eps)
"""


def test_npu701_list_shape_without_weight_keeps_torchscript(tmp_path):
    _apply(tmp_path, LIST_SHAPE)
    original = _import(tmp_path / "in" / "case.py", "review3_list_shape_in")
    torch.jit.script(original.Norm(8))  # the original scripts
    migrated = _import(tmp_path / "out" / "case.py", "review3_list_shape_out")
    scripted = torch.jit.script(migrated.Norm(8))  # RuntimeError: cannot statically infer ... size of a list
    x = torch.randn(3, 8)
    assert torch.equal(scripted(x), original.Norm(8)(x))


# 3. (b41dd8b's `_module_helper` looks at the function's own scope only) A function nested in another whose
#    enclosing scope binds `max_neg_value` (a closure over a fill value) is read as calling the module's
#    `max_neg_value` (the dtype's lowest): the branch drops the masked keys, where the original gives them a
#    score of `fill` (-1.0 here): on an NPU it computes something else.
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
