"""Issue #23: NPU708's xformers `memory_efficient_attention` wrapper, executed.

xformers is CUDA-only, so a stand-in `xformers.ops` of our own (`_stand_in`) models what it computes
(`xformers_reference`: plain torch attention of [B, M, H, K] tensors, 3-D [B, M, K] as one head, with
each bias's mask: `LowerTriangularMask` top-left, `LowerTriangularFromBottomRightMask` bottom-right, the
block-diagonal masks of `from_seqlens` on sequences packed as [1, total, H, K], causal per block). Each
fixture's `.out.py` runs with `_is_npu` forced true, the CPU reference kernels of
`npu_migrate.verify.reference` as `torch_npu` and xformers absent (as on an Ascend host: the migrated
imports bind None), against the `.in.py` original calling the stand-in: fp32 cosine >= 0.999, bf16 >= 0.99,
the kernel called once and xformers not at all. With `_is_npu` false the migrated code calls the stand-in
with the original arguments (the bias built as the original built it), bit for bit. The comparisons are
shown to fail on deliberately broken wrappers: causal aligned bottom-right for `LowerTriangularMask`, the
kernel's default scale of 1.0, BMHK read as BNSD, per-sequence lengths given as ends.

The model itself is checked against xformers where xformers is installed: its biases' dense form
(`materialize`, plain torch, on CPU too) against the model's masks, and, on an NVIDIA GPU, its kernels
against the model for every call of the fixture. Without xformers those two skip.
"""

from __future__ import annotations

import collections
import importlib.util
import sys
import types

import pytest
import torch
from conftest import FIXTURES
from test_fused_flash_attn import _cosine, _tensors  # large logits: a wrong mask or scale shows

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra

CASES = FIXTURES / "rules" / "NPU708"
TORCH_NPU = reference.torch_npu_module()


# -- a model of xformers, ours ------------------------------------------------------------------------------


class LowerTriangularMask:
    """Causal, aligned top-left: query i sees keys 0..i."""


class LowerTriangularFromBottomRightMask:
    """Causal, aligned bottom-right: query i sees keys 0..i + (Mk - Mq)."""


class BlockDiagonalMask:
    """Query block i sees key block i only."""

    causal = None  # None, "top-left" or "bottom-right", within each block

    def __init__(self, q_seqlen, kv_seqlen):
        self.q_seqlen, self.kv_seqlen = q_seqlen, kv_seqlen

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None, *, device=None):
        return cls(list(q_seqlen), list(q_seqlen if kv_seqlen is None else kv_seqlen))


class BlockDiagonalCausalMask(BlockDiagonalMask):
    causal = "top-left"


class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    causal = "bottom-right"


def _causal(mq: int, mk: int, aligned: str | None) -> torch.Tensor:
    """True where a query may attend."""
    if aligned is None:
        return torch.ones(mq, mk, dtype=torch.bool)
    return torch.ones(mq, mk, dtype=torch.bool).tril(0 if aligned == "top-left" else mk - mq)


def xformers_reference(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None):
    """What xformers' memory_efficient_attention computes (its documented equivalent), in plain torch."""
    assert p == 0.0 and op is None and output_dtype is None
    one_head = query.dim() == 3
    if one_head:
        query, key, value = (t.unsqueeze(2) for t in (query, key, value))
    mq, mk = query.shape[1], key.shape[1]
    if attn_bias is None:
        allowed = _causal(mq, mk, None)
    elif isinstance(attn_bias, LowerTriangularMask):
        allowed = _causal(mq, mk, "top-left")
    elif isinstance(attn_bias, LowerTriangularFromBottomRightMask):
        allowed = _causal(mq, mk, "bottom-right")
    else:
        assert isinstance(attn_bias, BlockDiagonalMask) and query.shape[0] == 1
        allowed = torch.zeros(mq, mk, dtype=torch.bool)
        q0 = k0 = 0
        for q_len, kv_len in zip(attn_bias.q_seqlen, attn_bias.kv_seqlen):
            allowed[q0 : q0 + q_len, k0 : k0 + kv_len] = _causal(q_len, kv_len, attn_bias.causal)
            q0, k0 = q0 + q_len, k0 + kv_len
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    q, k, v = (t.transpose(1, 2).float() for t in (query, key, value))
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).to(query.dtype)
    return out.squeeze(2) if one_head else out


def _stand_in(calls: collections.Counter) -> dict[str, types.ModuleType]:
    """`xformers`, `xformers.ops`, `xformers.ops.fmha`, `xformers.ops.fmha.attn_bias`: the model, counted."""

    def memory_efficient_attention(*args, **kwargs):
        calls["memory_efficient_attention"] += 1
        calls[type(kwargs.get("attn_bias", args[3] if len(args) > 3 else None)).__name__] += 1
        return xformers_reference(*args, **kwargs)

    names = {
        "memory_efficient_attention": memory_efficient_attention,
        "LowerTriangularMask": LowerTriangularMask,
        "LowerTriangularFromBottomRightMask": LowerTriangularFromBottomRightMask,
        "BlockDiagonalMask": BlockDiagonalMask,
        "BlockDiagonalCausalMask": BlockDiagonalCausalMask,
        "BlockDiagonalCausalFromBottomRightMask": BlockDiagonalCausalFromBottomRightMask,
    }
    modules = {}
    for name in ("xformers", "xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias"):
        modules[name] = types.ModuleType(name)
        modules[name].__dict__.update(names)
    modules["xformers"].ops = modules["xformers.ops"]
    modules["xformers.ops"].fmha = modules["xformers.ops.fmha"]
    modules["xformers.ops.fmha"].attn_bias = modules["xformers.ops.fmha.attn_bias"]
    return modules


@pytest.fixture(autouse=True)
def _torch_npu_installed(monkeypatch):
    """A migrated try-import re-raises without xformers unless torch_npu is installed: here, where neither
    is, it binds None as on an Ascend host."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "torch_npu" else real_find_spec(name, *a)
    )


XFORMERS_CALLS: collections.Counter = collections.Counter()


def _load(case: str, *, migrated: bool, npu: bool, xformers: bool = True, mutate=()):
    """The fixture's namespace, imported with the stand-in xformers installed or absent, on a simulated NPU
    or not."""
    text = (CASES / f"{case}.{'out' if migrated else 'in'}.py").read_text(encoding="utf-8")
    for old, new in mutate:
        assert old in text, f"mutant {old!r} does not apply to {case}"
        text = text.replace(old, new)
    saved = {name: sys.modules.get(name) for name in _stand_in(XFORMERS_CALLS)}
    sys.modules.update(_stand_in(XFORMERS_CALLS) if xformers else dict.fromkeys(saved))  # None: ImportError
    try:
        namespace = {"__name__": "fixture"}
        exec(compile(text, case, "exec"), namespace)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    if npu:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


Q_LENS, KV_LENS = [3, 4, 5], [5, 4, 7]  # q shorter than or as long as k, per sequence

#: case -> (fixture, function, inputs given a dtype, keyword arguments)
CALLS = {
    "no bias": ("xformers_calls", "dense", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
    "scale": ("xformers_calls", "dense", lambda d: _tensors((2, 6, 4, 16), (2, 6, 4, 16), (2, 6, 4, 16), dtype=d), {"scale": 0.7}),
    "BMHK, M = H": ("xformers_calls", "dense", lambda d: _tensors((2, 4, 4, 16), (2, 4, 4, 16), (2, 4, 4, 16), dtype=d), {}),
    "3-D BMK": ("xformers_calls", "one_head", lambda d: _tensors((2, 5, 16), (2, 7, 16), (2, 7, 16), dtype=d), {}),
    "causal, q shorter than k": ("xformers_calls", "causal", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
    "causal, q longer than k": ("xformers_calls", "causal", lambda d: _tensors((2, 9, 4, 16), (2, 6, 4, 16), (2, 6, 4, 16), dtype=d), {}),
    "causal bottom-right": ("xformers_calls", "causal_bottom_right", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
    "conditional causal": ("xformers_calls", "maybe_causal", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
    "conditional, no bias": ("xformers_calls", "maybe_causal", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {"is_causal": False}),
    "block-diagonal": ("xformers_calls", "varlen", lambda d: [*_tensors((1, 12, 4, 16), (1, 16, 4, 16), (1, 16, 4, 16), dtype=d), Q_LENS, KV_LENS], {}),
    "block-diagonal causal": ("xformers_calls", "varlen_causal", lambda d: [*_tensors((1, 16, 4, 16), (1, 16, 4, 16), (1, 16, 4, 16), dtype=d), KV_LENS], {}),
    "block-diagonal causal, q shorter than k": ("xformers_calls", "varlen_causal", lambda d: [*_tensors((1, 12, 4, 16), (1, 16, 4, 16), (1, 16, 4, 16), dtype=d), Q_LENS, KV_LENS], {}),
    "block-diagonal causal bottom-right": ("xformers_calls", "varlen_causal_bottom_right", lambda d: [*_tensors((1, 12, 4, 16), (1, 16, 4, 16), (1, 16, 4, 16), dtype=d), Q_LENS, KV_LENS], {}),
    "from-imports": ("from_imports", "attend", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
    "try-import": ("try_import", "attend", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
}  # fmt: skip


def _compare(case, dtype, mutate=(), xformers=False):
    """The cosine of the migrated call on a simulated NPU host with what xformers computes; `xformers`: the
    stand-in is installed there too (it is not on an Ascend host)."""
    fixture, function, inputs, options = CALLS[case]
    args = inputs(dtype)
    expected = _load(fixture, migrated=False, npu=False)[function](*args, **options)
    kernel, xformers_calls = TORCH_NPU.calls["npu_fusion_attention"], XFORMERS_CALLS["memory_efficient_attention"]
    got = _load(fixture, migrated=True, npu=True, xformers=xformers, mutate=mutate)[function](*args, **options)
    assert TORCH_NPU.calls["npu_fusion_attention"] == kernel + 1, "the kernel was not called once"
    assert XFORMERS_CALLS["memory_efficient_attention"] == xformers_calls, "xformers ran on the NPU path"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected)


@pytest.mark.parametrize("case", CALLS)
@pytest.mark.parametrize(("dtype", "least"), [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
def test_the_npu_path_computes_what_xformers_does(case, dtype, least):
    assert _compare(case, dtype) >= least


@pytest.mark.parametrize("case", CALLS)
def test_off_the_npu_xformers_runs_with_the_original_arguments_bit_for_bit(case):
    fixture, function, inputs, options = CALLS[case]
    args = inputs(torch.float32)
    before = XFORMERS_CALLS.copy()
    expected = _load(fixture, migrated=False, npu=False)[function](*args, **options)
    original = XFORMERS_CALLS - before
    kernel = TORCH_NPU.calls["npu_fusion_attention"]
    before = XFORMERS_CALLS.copy()
    got = _load(fixture, migrated=True, npu=False)[function](*args, **options)
    assert torch.equal(got, expected)
    # The function ran once, given a bias of the class the original built.
    assert XFORMERS_CALLS - before == original and original["memory_efficient_attention"] == 1
    assert TORCH_NPU.calls["npu_fusion_attention"] == kernel


#: A broken wrapper: (case, (text in the migrated fixture, what it becomes)).
MUTANTS = {
    # LowerTriangularMask aligned bottom-right, as flash-attn's causal is (sparse_mode 3, not 2).
    "causal bottom-right for top-left": ("causal, q shorter than k", ('bottom_right = kind.endswith("FromBottomRightMask")', "bottom_right = True")),
    "block causal bottom-right for top-left": ("block-diagonal causal, q shorter than k", ('bottom_right = kind.endswith("FromBottomRightMask")', "bottom_right = True")),
    # The bottom-right masks aligned top-left.
    "bottom-right as top-left": ("causal bottom-right", ('bottom_right = kind.endswith("FromBottomRightMask")', "bottom_right = False")),
    # The kernel's default scale, 1.0, instead of xformers' K**-0.5.
    "no scale": ("no bias", ("softmax_scale=scale,", "softmax_scale=1.0,")),
    "no scale varlen": ("block-diagonal", ("softmax_scale=scale,", "softmax_scale=1.0,")),
    # BMHK read as (B, N, S, D): heads and sequence swapped.
    "BMHK as BNSD": ("BMHK, M = H", ('"BSND",', '"BNSD",')),
    # The block lengths given to the kernel as they are, not as cumulative ends.
    "lengths as ends": ("block-diagonal", ("q_ends.append(q_ends[-1] + q_len)", "q_ends.append(q_len)")),
    # 3-D BMK: the head axis added in the wrong place.
    "BMK head axis": ("3-D BMK", ("(t.unsqueeze(2) for t in (query, key, value))", "(t.unsqueeze(1) for t in (query, key, value))")),
}  # fmt: skip


@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_broken_wrapper_fails_the_comparison(mutant):
    case, change = MUTANTS[mutant]
    assert change[0] in (CASES / f"{CALLS[case][0]}.out.py").read_text(encoding="utf-8"), "the mutant does not apply"
    try:
        cosine = _compare(case, torch.float32, mutate=[change])
    except RuntimeError as failure:  # the wrapper's own checks, or the device, reject it: as good a failure
        assert mutant in REJECTED, failure
        return
    assert cosine < 0.999  # the fp32 bar the rewrite is held to


#: The mutants that raise on an NPU host rather than compute something else: the lengths no longer add up
#: to the tensors' (the wrapper declines), the head axis read as the sequence (5 query heads over 7).
REJECTED = {"lengths as ends", "BMK head axis"}


def test_what_the_kernel_cannot_compute_raises_the_reason_on_an_npu_host():
    # xformers absent: nothing else could run it, the reason is raised.
    npu = _load("xformers_calls", migrated=True, npu=True, xformers=False)
    q, k, v = _tensors((2, 5, 2, 4, 16), (2, 7, 2, 4, 16), (2, 7, 2, 4, 16), dtype=torch.float16)
    with pytest.raises(RuntimeError, match="memory_efficient_attention on NPU tensors: .*5-D BMGHK"):
        npu["dense"](q, k, v)
    q, k, v = _tensors((1, 12, 4, 16), (1, 15, 4, 16), (1, 15, 4, 16), dtype=torch.float16)
    with pytest.raises(RuntimeError, match="sequence lengths adding up to 12 and 16, not 12 and 15"):
        npu["varlen"](q, k, v, Q_LENS, KV_LENS)
    q, k, v = _tensors((2, 12, 4, 16), (2, 16, 4, 16), (2, 16, 4, 16), dtype=torch.float16)
    with pytest.raises(RuntimeError, match="a block-diagonal bias with batch 2"):
        npu["varlen"](q, k, v, Q_LENS, KV_LENS)
    q, k, v = _tensors((1, 9, 4, 16), (1, 6, 4, 16), (1, 6, 4, 16), dtype=torch.float16)
    with pytest.raises(RuntimeError, match="a causal or windowed query longer than its keys"):
        npu["causal_bottom_right"](q, k, v)


def test_what_the_kernel_cannot_compute_runs_xformers_where_it_is_bound():
    # On NPU tensors, where the file bound xformers after all: the function runs, with the bias it built.
    npu = _load("xformers_calls", migrated=True, npu=True, xformers=True)
    q, k, v = _tensors((1, 9, 4, 16), (1, 6, 4, 16), (1, 6, 4, 16), dtype=torch.float64)  # not a kernel dtype
    before = XFORMERS_CALLS.copy()
    kernel = TORCH_NPU.calls["npu_fusion_attention"]
    got = npu["causal"](q, k, v)
    assert torch.equal(got, xformers_reference(q, k, v, LowerTriangularMask()))
    assert XFORMERS_CALLS - before == collections.Counter({"memory_efficient_attention": 1, "LowerTriangularMask": 1})
    assert TORCH_NPU.calls["npu_fusion_attention"] == kernel


def test_the_imports_made_conditional_import_without_xformers():
    # This machine has no xformers, as an Ascend host: the original does not import, the migrated file does.
    for case in ("xformers_calls", "from_imports"):
        with pytest.raises(ImportError):
            _load(case, migrated=False, npu=False, xformers=False)
        _load(case, migrated=True, npu=True, xformers=False)


def test_a_guarded_call_keeps_the_code_s_own_fallback_on_an_npu_host():
    npu = _load("try_import", migrated=True, npu=True, xformers=False)
    assert npu["XFORMERS_AVAILABLE"] is False and npu["xops"] is None
    q, k, v = _tensors((2, 5, 4, 16), (2, 5, 4, 16), (2, 5, 4, 16), dtype=torch.float32)
    kernel = TORCH_NPU.calls["npu_fusion_attention"]
    assert _cosine(npu["guarded"](q, k, v), xformers_reference(q, k, v)) >= 0.999
    assert TORCH_NPU.calls["npu_fusion_attention"] == kernel  # SDPA ran, not the kernel: the guard was kept


def test_a_migrated_import_re_raises_off_an_ascend_host(monkeypatch):
    # No xformers and no torch_npu: the original's ImportError.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ImportError):
        _load("xformers_calls", migrated=True, npu=False, xformers=False)


def test_the_findings_say_why_and_what_to_do():
    from npu_migrate.engine.pipeline import migrate_text

    source = (CASES / "declined.in.py").read_text(encoding="utf-8")
    _, findings = migrate_text(source, path="declined.py", select=["NPU708"])
    by_line = {f.line: f.message for f in findings}
    assert "its bias `bias` is built elsewhere" in by_line[9] and "build the bias in the call" in by_line[9]
    assert "`LowerTriangularMaskWithTensorBias` asks for a causal mask plus a tensor bias" in by_line[17]
    assert "port the call by hand" in by_line[17]
    assert "built by `make_causal`" in by_line[25]
    assert "`op=`" in by_line[35] and "`output_dtype`" in by_line[39] and "`*` / `**`" in by_line[43]
    guarded = migrate_text((CASES / "try_import.in.py").read_text(), path="t.py", select=["NPU708"])[1]
    (call,) = [f for f in guarded if f.line == 20]
    assert "its guard `XFORMERS_AVAILABLE` tests for xformers" in call.message
    (other,) = [f for f in guarded if f.line == 14]
    assert "guard" not in other.message


def _module(case: str, kind: str, folder, torch_npu):
    """The fixture imported from a file, with the stand-in xformers."""
    path = folder / f"{case}_{kind}.py"
    path.write_text((CASES / f"{case}.{kind}.py").read_text(encoding="utf-8"), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_xformers_fixture_{case}_{kind}_{id(folder)}", path)
    module = importlib.util.module_from_spec(spec)
    saved = {name: sys.modules.get(name) for name in _stand_in(XFORMERS_CALLS)}
    sys.modules.update(_stand_in(XFORMERS_CALLS))
    try:
        spec.loader.exec_module(module)
    finally:
        for name, original in saved.items():
            if original is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = original
    if hasattr(module, "_is_npu"):
        module.torch_npu = torch_npu
    return module


@pytest.mark.parametrize("torch_npu", ["absent", "dummy"])
def test_migrated_calls_survive_torch_compile(torch_npu, tmp_path):
    stand_in = types.ModuleType("torch_npu") if torch_npu == "dummy" else None
    original = _module("xformers_calls", "in", tmp_path, None)
    migrated = _module("xformers_calls", "out", tmp_path, stand_in)
    args = _tensors((1, 4, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8), dtype=torch.float32)
    torch._dynamo.reset()
    expected = torch.compile(original.causal, backend="eager")(*args)
    torch._dynamo.reset()
    got = torch.compile(migrated.causal, backend="eager")(*args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_broken_fallback_fails_the_bit_for_bit_check():
    # The bias read at the call not built again off the NPU (dropped): the function computes something else.
    fixture, function, inputs, options = CALLS["causal, q shorter than k"]
    args = inputs(torch.float32)
    expected = _load(fixture, migrated=False, npu=False)[function](*args, **options)
    before = XFORMERS_CALLS.copy()
    broken = _load(fixture, migrated=True, npu=False, mutate=[("return value.build()", "return None")])
    assert not torch.equal(broken[function](*args, **options), expected)
    assert (XFORMERS_CALLS - before)["LowerTriangularMask"] == 0  # the count tells it too


def _xformers_biases():
    """xformers' bias classes, which are plain torch (`materialize`), on any host where it is installed."""
    try:
        from xformers.ops.fmha import attn_bias
    except ImportError:
        return None
    return attn_bias


@pytest.mark.skipif(_xformers_biases() is None, reason="needs xformers installed (its biases run on CPU)")
@pytest.mark.parametrize(
    ("q_lens", "kv_lens"), [([5], [9]), ([9], [6]), ([6], [6]), (Q_LENS, KV_LENS), (KV_LENS, None)]
)
def test_the_model_s_masks_are_xformers_own(q_lens, kv_lens):
    # xformers' own dense form of each bias (0 = attend, -inf = masked) against the model's `allowed`.
    attn_bias = _xformers_biases()
    kv_total = sum(kv_lens or q_lens)
    shape = (sum(q_lens), kv_total)
    masks = [BlockDiagonalMask, BlockDiagonalCausalMask, BlockDiagonalCausalFromBottomRightMask]
    if len(q_lens) == 1:
        masks = [LowerTriangularMask, LowerTriangularFromBottomRightMask, *masks]
    for model in masks:
        if model is BlockDiagonalCausalFromBottomRightMask and any(q > k for q, k in zip(q_lens, kv_lens or q_lens)):
            continue  # xformers refuses a block with more queries than keys
        ours = model.from_seqlens(q_lens, kv_lens) if issubclass(model, BlockDiagonalMask) else model()
        theirs = _REAL_BIASES[model](attn_bias, ours)
        assert torch.equal(theirs.materialize(shape) == 0, _model_allowed(ours, *shape)), model.__name__


def _model_allowed(bias, mq: int, mk: int) -> torch.Tensor:
    """The model's mask of `bias`, read through `xformers_reference` itself: one-hot values show which keys
    each query attends to."""
    query = torch.zeros(1, mq, 1, 1)
    key = torch.zeros(1, mk, 1, 1)
    value = torch.eye(mk).reshape(1, mk, 1, mk)
    out = xformers_reference(query, key, value.expand(1, mk, 1, mk), bias)  # uniform over the attended keys
    return out[0, :, 0, :] > 0


def _real_xformers():
    """xformers itself (its ops and its bias classes)."""
    import xformers.ops as xops
    from xformers.ops.fmha import attn_bias

    return xops, attn_bias


def _xformers_missing() -> str | None:
    """Why xformers' own kernels cannot run here, or None. Its wheels are built for one torch / CUDA pair;
    on another its library does not load and every call raises "No operator found": nothing to compare
    with, which is a fact of the machine, not of the model (seen: xformers 0.0.35, built for torch
    2.10+cu128, on torch 2.11+cu130)."""
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU and CUDA torch"
    try:
        _real_xformers()
        from xformers import _cpp_lib
    except ImportError:
        return "needs xformers installed"
    if getattr(_cpp_lib, "_build_metadata", None) is None:
        error = getattr(_cpp_lib, "_cpp_library_load_exception", None)
        return f"xformers' CUDA library did not load with torch {torch.__version__}: {error}"
    return None


#: The model's bias -> xformers' own, built alike.
_REAL_BIASES = {
    LowerTriangularMask: lambda ab, b: ab.LowerTriangularMask(),
    LowerTriangularFromBottomRightMask: lambda ab, b: ab.LowerTriangularFromBottomRightMask(),
    BlockDiagonalMask: lambda ab, b: ab.BlockDiagonalMask.from_seqlens(b.q_seqlen, b.kv_seqlen),
    BlockDiagonalCausalMask: lambda ab, b: ab.BlockDiagonalCausalMask.from_seqlens(b.q_seqlen, b.kv_seqlen),
    BlockDiagonalCausalFromBottomRightMask: lambda ab, b: ab.BlockDiagonalCausalFromBottomRightMask.from_seqlens(
        b.q_seqlen, b.kv_seqlen
    ),
}


@pytest.mark.skipif(_xformers_missing() is not None, reason=str(_xformers_missing()))
@pytest.mark.parametrize("case", [c for c in CALLS if CALLS[c][0] == "xformers_calls"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_model_computes_what_xformers_does_on_cuda(case, dtype):
    # What every comparison above rests on: the torch model of xformers is xformers (its CUDA kernels).
    xops, attn_bias = _real_xformers()
    _, function, inputs, options = CALLS[case]
    args = inputs(dtype)
    seen = []

    def model(*call_args, **call_kwargs):
        seen.append((call_args, call_kwargs))
        return xformers_reference(*call_args, **call_kwargs)

    namespace = _load("xformers_calls", migrated=False, npu=False)
    namespace["xops"] = types.SimpleNamespace(**{**vars(namespace["xops"]), "memory_efficient_attention": model})
    namespace["fmha"] = types.SimpleNamespace(**{**vars(namespace["fmha"]), "memory_efficient_attention": model})
    expected = namespace[function](*args, **options)
    ((call_args, call_kwargs),) = seen
    call_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in call_args]
    bias = call_kwargs.pop("attn_bias", call_args[3] if len(call_args) > 3 else None)
    call_args = call_args[:3]
    if bias is not None:
        bias = _REAL_BIASES[type(bias)](attn_bias, bias)
    got = xops.memory_efficient_attention(*call_args, attn_bias=bias, **call_kwargs).cpu()
    assert _cosine(got, expected) >= 0.999


def test_dropout_is_the_kernel_s_keep_prob():
    # xformers drops out whenever p > 0 (it knows no training mode), as the kernel does below keep_prob 1.
    asked = []
    kernel = types.SimpleNamespace(
        npu_fusion_attention=lambda *args, **kwargs: (
            asked.append(kwargs) or TORCH_NPU.npu_fusion_attention(*args, **kwargs)
        )
    )
    npu = _load("xformers_calls", migrated=True, npu=True, xformers=False)
    npu["torch_npu"] = kernel
    q, k, v = _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=torch.float32)
    out = npu["dense"](q, k, v, p=0.25)
    assert [a["keep_prob"] for a in asked] == [0.75] and out.shape == q.shape


def test_a_wrapper_that_never_takes_the_kernel_fails_the_call_count():
    # Where xformers is bound (so that the call does not raise), the output is right, but the count says that
    # the kernel did not run.
    never = ('if _is_npu_flash_call(args, kwargs, "query"):', "if False:")
    assert _compare("causal, q shorter than k", torch.float32, xformers=True) >= 0.999
    with pytest.raises(AssertionError, match="the kernel was not called once"):
        _compare("causal, q shorter than k", torch.float32, mutate=[never], xformers=True)
