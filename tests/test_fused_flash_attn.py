"""Issue #14, idiom 4: NPU705's flash-attn wrappers, executed.

A CPU model of flash-attn's semantics of our own (`flash_reference`: SDPA with a bottom-right aligned causal
or sliding-window mask, GQA by repeated kv heads, varlen by a loop over the sequences) stands in for
flash-attn. Each fixture's `.out.py` runs with `_is_npu` forced true, the CPU reference kernels of
`npu_migrate.verify.reference` as `torch_npu` and flash-attn absent (as on an Ascend host), against the
`.in.py` original calling the model: fp32 cosine >= 0.999, bf16 >= 0.99, and the kernel must have been
called. With `_is_npu` false the migrated code calls the function it was given, bit for bit. The comparisons
are shown to fail on deliberately broken wrappers: causal aligned top-left (sparse_mode 2) with q shorter
than k, and the scale left to the kernel's default of 1.0.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra

CASES = FIXTURES / "rules" / "NPU705"
TORCH_NPU = reference.torch_npu_module()
FUNCTIONS = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func")


def flash_reference(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), *, bottom_right=True, **unused
):
    """flash-attn's attention of (B, S, N, D) tensors: a causal mask aligned bottom-right (>= 2.1; top-left
    before), `window_size` = (left, right) keys around that diagonal, -1 = unbounded."""
    assert dropout_p == 0.0 and unused.get("alibi_slopes") is None and not unused.get("softcap")
    sq, heads, dim = q.shape[1], q.shape[2], q.shape[3]
    skv, kv_heads = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else dim**-0.5
    row = torch.arange(sq)[:, None] + (skv - sq if bottom_right else 0)
    column = torch.arange(skv)[None, :]
    left, right = window_size
    right = 0 if causal else right
    attend = torch.ones(sq, skv, dtype=torch.bool)
    if left >= 0:
        attend &= column >= row - left
    if right >= 0:
        attend &= column <= row + right
    qb, kb, vb = (t.transpose(1, 2).float() for t in (q, k, v))
    kb, vb = kb.repeat_interleave(heads // kv_heads, 1), vb.repeat_interleave(heads // kv_heads, 1)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=attend, scale=scale)
    return out.transpose(1, 2).to(q.dtype)


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout_p=0.0, **options):
    """flash-attn's varlen attention of (T, N, D) tensors: each sequence on its own."""
    q_ends, kv_ends = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    parts = [
        flash_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dropout_p, **options)[0]
        for q0, q1, k0, k1 in zip(q_ends, q_ends[1:], kv_ends, kv_ends[1:])
    ]
    return torch.cat(parts)


def unpadded_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout_p, softmax_scale=None, causal=False):
    """flash-attn 1.x: causal aligned top-left."""
    options = {"softmax_scale": softmax_scale, "causal": causal, "bottom_right": False}
    return varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout_p, **options)


FLASH_ATTN = {
    "flash_attn_func": flash_reference,
    "flash_attn_kvpacked_func": lambda q, kv, *a, **o: flash_reference(q, *kv.unbind(2), *a, **o),
    "flash_attn_qkvpacked_func": lambda qkv, *a, **o: flash_reference(*qkv.unbind(2), *a, **o),
    "flash_attn_varlen_func": varlen_reference,
    "flash_attn_unpadded_func": unpadded_reference,
    "flash_attn_varlen_qkvpacked_func": lambda qkv, cu, s, *a, **o: varlen_reference(
        *qkv.unbind(1), cu, cu, s, s, *a, **o
    ),
}


@pytest.fixture(autouse=True)
def _torch_npu_installed(monkeypatch):
    """A migrated try-import re-raises without flash-attn unless torch_npu is installed: here, where neither
    is, it binds None as on an Ascend host, and the names get our model of flash-attn (`_load`) or stay
    None. (Without this, `test_a_migrated_import_re_raises_off_an_ascend_host`.)"""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "torch_npu" else real_find_spec(name, *a)
    )


def _load(case: str, *, migrated: bool, npu: bool, flash_attn: bool = True, mutate=()):
    """The fixture's namespace: with flash-attn (our model) bound to its names or absent (None, as the
    fixture's try-import leaves them here), and on a simulated NPU or not."""
    text = (CASES / f"{case}.{'out' if migrated else 'in'}.py").read_text(encoding="utf-8")
    for old, new in mutate:
        assert old in text, f"mutant {old!r} does not apply to {case}"
        text = text.replace(old, new)
    namespace = {"__name__": "fixture"}
    exec(compile(text, case, "exec"), namespace)
    for name in FLASH_ATTN:
        if name in namespace:
            namespace[name] = FLASH_ATTN[name] if flash_attn else None
    if npu:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _tensors(*shapes, dtype):
    generator = torch.Generator().manual_seed(0)
    # Large logits: a wrong mask alignment or scale changes the output a lot.
    return [(3 * torch.randn(shape, generator=generator)).to(dtype) for shape in shapes]


def _cosine(a, b) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


CU_Q, CU_K = torch.tensor([0, 3, 7, 12]), torch.tensor([0, 5, 9, 16])  # q shorter than or as long as k

#: case -> (fixture, function, inputs given a dtype, keyword arguments)
CALLS = {
    "causal, q shorter than k": ("flash_calls", "dense", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {}),
    "not causal": ("flash_calls", "dense", lambda d: _tensors((2, 5, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {"causal": False}),
    "softmax_scale": ("flash_calls", "dense", lambda d: _tensors((2, 6, 4, 16), (2, 6, 4, 16), (2, 6, 4, 16), dtype=d), {"softmax_scale": 0.7}),
    "grouped kv heads": ("flash_calls", "dense", lambda d: _tensors((2, 5, 4, 16), (2, 7, 2, 16), (2, 7, 2, 16), dtype=d), {}),
    "sliding window": ("flash_calls", "dense", lambda d: _tensors((2, 6, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {"causal": False, "window_size": (2, 1)}),
    "causal window": ("flash_calls", "dense", lambda d: _tensors((2, 6, 4, 16), (2, 9, 4, 16), (2, 9, 4, 16), dtype=d), {"window_size": (3, -1)}),
    "kv packed": ("flash_calls", "packed_kv", lambda d: _tensors((2, 5, 4, 16), (2, 9, 2, 4, 16), dtype=d), {}),
    "qkv packed": ("flash_calls", "packed_qkv", lambda d: _tensors((2, 7, 3, 4, 16), dtype=d), {}),
    "varlen": ("flash_calls", "varlen", lambda d: [*_tensors((12, 4, 16), (16, 4, 16), (16, 4, 16), dtype=d), CU_Q, CU_K], {}),
    "unpadded (1.x, top-left)": ("unpadded", "attend", lambda d: [*_tensors((12, 4, 16), (16, 4, 16), (16, 4, 16), dtype=d), CU_Q, CU_K, 5, 7], {}),
    "varlen qkv packed": ("varlen_packed", "attend", lambda d: [*_tensors((16, 3, 4, 16), dtype=d), CU_K], {}),
    "varlen qkv packed, window": ("varlen_packed", "attend", lambda d: [*_tensors((16, 3, 4, 16), dtype=d), CU_K], {"causal": False, "window_size": (2, 1)}),
}  # fmt: skip


def _compare(case, dtype, mutate=()):
    fixture, function, inputs, options = CALLS[case]
    args = inputs(dtype)
    expected = _load(fixture, migrated=False, npu=False)[function](*args, **options)
    before = TORCH_NPU.calls["npu_fusion_attention"]
    got = _load(fixture, migrated=True, npu=True, flash_attn=False, mutate=mutate)[function](*args, **options)
    assert TORCH_NPU.calls["npu_fusion_attention"] == before + 1, "the kernel was not called"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected)


@pytest.mark.parametrize("case", CALLS)
@pytest.mark.parametrize(("dtype", "least"), [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
def test_the_npu_path_computes_what_flash_attn_does(case, dtype, least):
    assert _compare(case, dtype) >= least


@pytest.mark.parametrize("case", CALLS)
def test_off_the_npu_the_function_runs_bit_for_bit(case):
    fixture, function, inputs, options = CALLS[case]
    args = inputs(torch.float32)
    expected = _load(fixture, migrated=False, npu=False)[function](*args, **options)
    before = TORCH_NPU.calls["npu_fusion_attention"]
    got = _load(fixture, migrated=True, npu=False)[function](*args, **options)
    assert torch.equal(got, expected)
    assert TORCH_NPU.calls["npu_fusion_attention"] == before


@pytest.mark.parametrize(
    ("case", "mutant"),
    [
        # Causal aligned top-left (SDPA's is_causal) where q is shorter than k.
        ("causal, q shorter than k", ("sparse_mode = 3 if bottom_right else 2", "sparse_mode = 2")),
        ("varlen", ("sparse_mode = 3 if bottom_right else 2", "sparse_mode = 2")),
        # 1.x's top-left alignment taken as bottom-right.
        ("unpadded (1.x, top-left)", ("sparse_mode = 3 if bottom_right else 2", "sparse_mode = 3")),
        # The kernel's default scale, 1.0, instead of flash-attn's D**-0.5.
        ("causal, q shorter than k", ("atten_mask=mask,\n            scale=scale,", "atten_mask=mask,")),
        ("varlen", ("atten_mask=mask,\n            scale=scale,", "atten_mask=mask,")),
        ("varlen qkv packed", ("atten_mask=mask,\n            scale=scale,", "atten_mask=mask,")),
        # k and v taken from each other's slot of the stack.
        (
            "varlen qkv packed",
            ("q, k, v = (t.contiguous() for t in qkv.unbind(1))", "q, v, k = (t.contiguous() for t in qkv.unbind(1))"),
        ),
    ],
    ids=[
        "top-left causal",
        "top-left causal varlen",
        "bottom-right 1.x",
        "no scale",
        "no scale varlen",
        "no scale varlen packed",
        "varlen packed k and v swapped",
    ],
)
def test_a_broken_wrapper_fails_the_comparison(case, mutant):
    assert _compare(case, torch.float32, mutate=[mutant]) < 0.999  # the fp32 bar the rewrite is held to


def test_what_the_kernel_cannot_compute_runs_the_fallback_or_says_why():
    q, k, v = _tensors((1, 4, 2, 8), (1, 4, 2, 8), (1, 4, 2, 8), dtype=torch.float16)
    slopes = torch.ones(2)
    # ALiBi reaches the wrapper through a variable: on an NPU host, no flash-attn, the reason is raised.
    absent = _load("declined", migrated=True, npu=True, flash_attn=False)
    with pytest.raises(RuntimeError, match="flash_attn_func on NPU tensors: .*alibi_slopes"):
        absent["with_alibi"](q, k, v, slopes)
    # A name bound to a fallback runs it.
    calls = []
    bound = _load("declined", migrated=True, npu=True, flash_attn=False)
    bound["flash_attn_func"] = lambda *args, **kwargs: calls.append(kwargs) or "fallback"
    assert bound["with_alibi"](q, k, v, slopes) == "fallback"
    assert calls == [{"causal": True, "alibi_slopes": slopes}]


def test_a_causal_query_longer_than_its_keys_is_not_given_to_the_kernel():
    q, k, v = _tensors((1, 6, 2, 8), (1, 4, 2, 8), (1, 4, 2, 8), dtype=torch.float16)
    npu = _load("flash_calls", migrated=True, npu=True, flash_attn=False)
    with pytest.raises(RuntimeError, match="a causal or windowed query longer than its keys"):
        npu["dense"](q, k, v)


def test_an_unconditional_import_made_conditional_imports_without_flash_attn():
    # This machine has no flash-attn, as an Ascend host: the original does not import, the migrated file does
    # and takes the kernel.
    with pytest.raises(ImportError):
        _load("unconditional_import", migrated=False, npu=False)
    migrated = _load("unconditional_import", migrated=True, npu=True, flash_attn=False)
    assert migrated["flash_attn_func"] is None
    q, k, v = _tensors((1, 4, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8), dtype=torch.bfloat16)
    expected = flash_reference(q, k, v, causal=True)
    assert _cosine(migrated["attend"](q, k, v), expected) >= 0.99


def test_an_import_inside_a_function_made_conditional_runs_without_flash_attn():
    # The original's functions raise ImportError at their import here (no flash-attn, as on an Ascend host); the
    # migrated ones bind None and take the kernel, or (`tested`) their own fallback for a name that is None.
    original = _load("function_import", migrated=False, npu=False)
    q, k, v = _tensors((1, 4, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8), dtype=torch.bfloat16)
    for function in ("local", "tested"):
        with pytest.raises(ImportError):
            original[function](q, k, v)
    migrated = _load("function_import", migrated=True, npu=True, flash_attn=False)
    before = TORCH_NPU.calls["npu_fusion_attention"]
    assert _cosine(migrated["local"](q, k, v), flash_reference(q, k, v, causal=True)) >= 0.99
    assert TORCH_NPU.calls["npu_fusion_attention"] == before + 1
    q, k, v = _tensors((1, 5, 2, 8), (1, 5, 2, 8), (1, 5, 2, 8), dtype=torch.float32)
    assert _cosine(migrated["tested"](q, k, v), flash_reference(q, k, v)) >= 0.999
    assert TORCH_NPU.calls["npu_fusion_attention"] == before + 1  # the fallback ran, not the kernel
    # What stays unconditional still fails, as the finding says.
    with pytest.raises(ImportError):
        migrated["kept"](q, k, v)


def test_sequence_ends_with_the_leading_zero_are_rejected_as_the_device_rejects_them():
    # cu_seqlens as flash-attn has them (a leading 0) are not the kernel's actual_seq_qlen.
    with pytest.raises(reference.NpuOpError, match="without a leading 0"):
        _compare("varlen", torch.float32, mutate=[("q_ends, kv_ends = q_ends[1:], kv_ends[1:]", "")])


def test_a_call_behind_a_guard_that_is_false_on_an_npu_host_says_so():
    from npu_migrate.engine.pipeline import migrate_text

    source = (CASES / "guarded.in.py").read_text(encoding="utf-8")
    _, findings = migrate_text(source, path="guarded.py", select=["NPU705"])
    (call,) = [f for f in findings if f.line == 13]
    assert "its guard `flash_attn_func is not None and q.is_cuda` is False" in call.message
    (other,) = [f for f in migrate_text((CASES / "flash_calls.in.py").read_text(), path="f.py")[1] if f.line == 12]
    assert "guard" not in other.message


def _module(case: str, kind: str, folder, torch_npu):
    """The fixture imported from a file (TorchScript reads the source), flash-attn bound to our model."""
    path = folder / f"{case}_{kind}.py"
    path.write_text((CASES / f"{case}.{kind}.py").read_text(encoding="utf-8"), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_flash_fixture_{case}_{kind}_{id(folder)}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    for name in FLASH_ATTN:
        if hasattr(module, name):
            setattr(module, name, FLASH_ATTN[name])
    if hasattr(module, "_is_npu"):
        module.torch_npu = torch_npu
    return module


def _graph(mode, fn, args):
    try:
        if mode == "jit.script":
            return torch.jit.script(fn)(*args), None
        if mode == "fx.symbolic_trace":
            return torch.fx.symbolic_trace(fn)(*args), None
        torch._dynamo.reset()
        return torch.compile(fn, backend="eager")(*args), None
    except Exception as exc:  # noqa: BLE001 - which graph modes the original survives is what is measured
        return None, exc


@pytest.mark.parametrize("torch_npu", ["absent", "dummy"])
@pytest.mark.parametrize("mode", ["jit.script", "fx.symbolic_trace", "compile(eager)"])
def test_migrated_calls_survive_every_graph_mode_the_original_does(mode, torch_npu, tmp_path):
    stand_in = types.ModuleType("torch_npu") if torch_npu == "dummy" else None
    original = _module("flash_calls", "in", tmp_path, None)
    migrated = _module("flash_calls", "out", tmp_path, stand_in)
    args = _tensors((1, 4, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8), dtype=torch.float32)
    expected, failure = _graph(mode, original.dense, args)
    got, migrated_failure = _graph(mode, migrated.dense, args)
    # A Python function of flash-attn's signature is neither scriptable nor traceable with proxies.
    assert (failure is None) == (mode == "compile(eager)"), repr(failure)
    if failure is not None:
        return  # the original does not survive this mode: nothing to keep
    assert migrated_failure is None, f"survives {mode} before migration, not after: {migrated_failure!r}"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_migrated_import_re_raises_off_an_ascend_host(monkeypatch):
    # No flash-attn and no torch_npu (a CPU host, a CUDA host with a broken flash-attn): the original's
    # ImportError, which a caller's `try: ... except ImportError:` fallback may be waiting for.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    text = (CASES / "unconditional_import.out.py").read_text(encoding="utf-8")
    with pytest.raises(ImportError, match="flash_attn"):
        exec(compile(text, "unconditional_import", "exec"), {"__name__": "fixture"})
