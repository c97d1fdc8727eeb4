"""NPU701 per way through `if`s on the module's own configuration: the numbers.

RMSNorm modules that choose their way with a flag or their weight (`if not self.wide:`, `if self.weight is
not None:`, T5's `if self.weight.dtype in [torch.float16, torch.bfloat16]:`) get one branch per way that is
RMSNorm, each guarded by its way's tests. The fixtures' own modules (`fixtures/rules/NPU701/*.in.py`, our
code) run before and after migration, with `_is_npu` forced true and the CPU reference kernels as
`torch_npu`: on each way the branch computes what the original does, dtype included (fp32 cosine >= 0.999,
bf16 / fp16 >= 0.99), calling the kernel once where its way fuses and never where it does not (no weight,
a weight in another dtype than the input where that would promote, a float64 input); off the NPU the
migrated code is bit-identical. Broken branches are caught: a wrong eps, gamma dropped, a cast missing or
added, the branch taken on the wrong way. Whatever graph mode the original survives (TorchScript, FX,
torch.compile), the migrated module survives too, bit for bit (off the NPU): a way's test is an `if` of its
own, which TorchScript prunes on a None weight.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # torch: the `integration` extra

TORCH_NPU = reference.torch_npu_module()
FLOOR = {torch.float32: 0.999, torch.bfloat16: 0.99, torch.float16: 0.99, torch.float64: 0.999}
BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
RULE_DIR = FIXTURES / "rules" / "NPU701"

#: (fixture, class, constructor keywords, input dtype, weight dtype, kernel calls expected)
CASES = [
    ("flag_functional", "ScaleNorm", {"wide": False}, BF16, BF16, 1),
    ("flag_functional", "ScaleNorm", {"wide": False}, F32, F32, 1),
    ("flag_functional", "ScaleNorm", {"wide": True}, BF16, F32, 1),
    ("flag_functional", "ScaleNorm", {"wide": True}, F16, BF16, 1),
    ("flag_upcast", "GainNorm", {"reduce_in_fp32": True}, BF16, BF16, 1),
    ("flag_upcast", "GainNorm", {"reduce_in_fp32": False}, BF16, BF16, 1),
    ("flag_upcast", "GainNorm", {"reduce_in_fp32": False}, F32, F32, 1),
    ("flag_upcast", "GainNorm", {"reduce_in_fp32": True}, BF16, F32, 0),  # the fp32 weight promotes the output
    ("optional_weight", "MaybeAffineNorm", {"affine": True}, BF16, BF16, 1),
    ("optional_weight", "MaybeAffineNorm", {"affine": True}, BF16, F32, 1),
    ("optional_weight", "MaybeAffineNorm", {"affine": True}, F32, F32, 1),
    ("optional_weight", "MaybeAffineNorm", {"affine": False}, BF16, None, 0),  # no gamma: the original runs
    ("weight_dtype_cast", "HalfAwareNorm", {}, BF16, BF16, 1),  # cast to the half weight's dtype
    ("weight_dtype_cast", "HalfAwareNorm", {}, F16, F16, 1),
    ("weight_dtype_cast", "HalfAwareNorm", {}, BF16, F32, 1),  # no cast: float32 out of a bf16 input
    ("weight_dtype_cast", "HalfAwareNorm", {}, F32, F32, 1),
    ("weight_dtype_cast", "HalfAwareNorm", {}, F32, BF16, 0),  # the cast is to bf16, not the input's dtype
    ("weight_dtype_cast", "HalfAwareNorm", {}, F64, F32, 0),  # float64 times the root stays float64
]


def _ids(case) -> str:
    fixture, _, kwargs, x_dtype, w_dtype, _ = case
    flags = ",".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{fixture}[{flags}]-x:{str(x_dtype)[6:]}-w:{str(w_dtype)[6:] if w_dtype else None}"


def _texts(fixture: str) -> tuple[str, str]:
    text = (RULE_DIR / f"{fixture}.in.py").read_text()
    out, findings = migrate_text(text, path=f"{fixture}.py", select=["NPU701"])
    assert any(f.fixed and "per way" in f.message for f in findings), [f.message for f in findings]
    return text, out


def _module(text: str, name: str, kwargs: dict, w_dtype, *, forced: bool, mutate=(), file=None):
    """The fixture's class built from `text`; from a real file when `file` is given (TorchScript reads the
    source of what it compiles)."""
    for old, new in mutate:
        assert old in text, old
        text = text.replace(old, new)
    if file is None:
        namespace = {"__name__": "paths"}
        exec(compile(text, "paths.py", "exec"), namespace)
    else:
        file.write_text(text)
        spec = importlib.util.spec_from_file_location(file.stem, file)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[file.stem] = loaded
        spec.loader.exec_module(loaded)
        namespace = vars(loaded)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    module = namespace[name](32, eps=1e-5, **kwargs)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in module.parameters():  # a weight far from ones: a dropped gamma shows
            parameter.copy_(1 + 0.5 * torch.randn(parameter.shape, generator=g))
    return module.to(w_dtype) if w_dtype is not None else module


def _input(dtype):
    g = torch.Generator().manual_seed(5)
    # rows of very different scale, so that a wrong eps changes directions, not only sizes
    scale = torch.tensor([1e-3, 1.0, 3e-3, 2.0]).view(4, 1, 1)
    return (scale * torch.randn(4, 6, 32, generator=g)).to(dtype)


def _run(module, x):
    before = TORCH_NPU.calls["npu_rms_norm"]
    with torch.no_grad():
        out = module(x)
    return out, TORCH_NPU.calls["npu_rms_norm"] - before


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def _agrees(case, mutate=()) -> bool:
    """Whether the migrated module, forced onto the branch, computes what the original does on the case's
    way: the kernel called as often as expected, the same dtype, the cosine floor."""
    fixture, name, kwargs, x_dtype, w_dtype, calls = case
    text, out = _texts(fixture)
    x = _input(x_dtype)
    expected, _ = _run(_module(text, name, kwargs, w_dtype, forced=False), x)
    got, called = _run(_module(out, name, kwargs, w_dtype, forced=True, mutate=mutate), x)
    return called == calls and got.dtype == expected.dtype and _cosine(got, expected) >= FLOOR[x_dtype]


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_each_way_computes_what_the_original_does(case):
    assert _agrees(case)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_off_the_npu_the_migrated_module_is_bit_identical(case):
    fixture, name, kwargs, x_dtype, w_dtype, _ = case
    text, out = _texts(fixture)
    x = _input(x_dtype)
    expected, _ = _run(_module(text, name, kwargs, w_dtype, forced=False), x)
    got, called = _run(_module(out, name, kwargs, w_dtype, forced=False), x)
    assert called == 0 and got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("fixture", sorted({c[0] for c in CASES}))
def test_a_second_run_changes_nothing(fixture):
    _, out = _texts(fixture)
    assert migrate_text(out, path=f"{fixture}.py", select=["NPU701"])[0] == out


def _case(fixture, kwargs, x_dtype, w_dtype):
    return next(c for c in CASES if c[0] == fixture and c[2] == kwargs and c[3:5] == (x_dtype, w_dtype))


MUTANTS = {
    # the wrong eps, on each kind of branch
    "eps-functional": (_case("flag_functional", {"wide": True}, BF16, F32), [("epsilon=self.eps", "epsilon=0.1")]),
    "eps-upcast": (_case("flag_upcast", {"reduce_in_fp32": True}, BF16, BF16), [("epsilon=self.eps", "epsilon=0.1")]),
    # gamma dropped
    "gamma": (
        _case("optional_weight", {"affine": True}, F32, F32),
        [("self.weight.float(), epsilon", "torch.ones_like(self.weight.float()), epsilon")],
    ),
    # the cast back missing: float32 out of a bf16 input, where the original casts back
    "cast-missing": (_case("optional_weight", {"affine": True}, BF16, BF16), [("[0].to(h.dtype)", "[0]")]),
    # a cast added where the original returns float32 (T5 with a float32 weight)
    "cast-added": (
        _case("weight_dtype_cast", {}, BF16, F32),
        [("epsilon=self.eps)[0]\n        ms", "epsilon=self.eps)[0].to(h.dtype)\n        ms")],
    ),
    # T5's float32 way taken on the half weight's way: its branch has no cast, so the output is float32
    "wrong-way": (
        _case("weight_dtype_cast", {}, BF16, BF16),
        [
            ("            if self.weight.dtype in [torch.float16, torch.bfloat16]:", "            if False:"),
            ("            if self.weight.dtype not in [torch.float16, torch.bfloat16]:", "            if True:"),
        ],
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_a_broken_branch_is_caught(name):
    case, mutate = MUTANTS[name]
    assert _agrees(case)  # the check passes on the real rewrite ...
    assert not _agrees(case, mutate)  # ... and fails on the broken one


def _script(module):
    return torch.jit.script(module)


def _trace(module):
    return torch.fx.symbolic_trace(module)


def _compile(module):
    return torch.compile(module, backend="eager")


GRAPH_CASES = sorted({(c[0], c[1], tuple(c[2].items())) for c in CASES})


@pytest.mark.parametrize("mode", [_script, _trace, _compile], ids=["script", "fx", "compile"])
@pytest.mark.parametrize("case", GRAPH_CASES, ids=[f"{c[0]}{dict(c[2])}" for c in GRAPH_CASES])
def test_the_migrated_module_survives_every_graph_mode_the_original_does(case, mode, tmp_path):
    fixture, name, kwargs = case
    text, out = _texts(fixture)
    x = _input(torch.float32)
    stem = f"{fixture}_{mode.__name__[1:]}_{abs(hash(kwargs))}"
    original = _module(text, name, dict(kwargs), torch.float32, forced=False, file=tmp_path / f"{stem}_in.py")
    try:
        expected = mode(original)(x)
    except Exception as error:  # noqa: BLE001 -- the original does not survive this mode: nothing to keep
        pytest.skip(f"the original fails too: {type(error).__name__}")
    migrated = mode(_module(out, name, dict(kwargs), torch.float32, forced=False, file=tmp_path / f"{stem}_out.py"))(x)
    assert torch.equal(migrated, expected)
