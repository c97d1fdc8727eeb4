"""Issue #14: the fused branches of NPU701 (RMSNorm) and NPU702 (SwiGLU) in spellings outside
transformers, executed.

Each fixture's `.out.py` runs with `_is_npu` forced true and the CPU reference kernels of
`npu_migrate.verify.reference` as `torch_npu`, against the `.in.py` original: fp32 cosine >= 0.999, bf16 >=
0.99, and the kernel must have been called. With `_is_npu` false the migrated code must give the
original's bits. Weights are perturbed and large (at default init a wrong rewrite can still score 0.9996),
and each comparison is shown to fail on a deliberately broken rewrite (a mutant of the generated text).
`fixtures/projects/qwen_like` is our own Qwen-7B-shaped model: migrated with `apply --output`, its block
must agree with the original, and `analyze --mode affinity_apis` must count its sites.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

RULES = FIXTURES / "rules"
TORCH_NPU = reference.torch_npu_module()


def _load(path, *, forced: bool, mutate=None):
    text = path.read_text(encoding="utf-8")
    if mutate is not None:
        old, new = mutate
        assert old in text, f"mutant {old!r} does not apply to {path.name}"
        text = text.replace(old, new)
    namespace = {"__name__": "fixture"}
    exec(compile(text, str(path), "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _cosine(a, b) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _perturb(module, generator):
    """Large weights, norm weights far from one: wrong rewrites show."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.dim() == 1:
                parameter.copy_(1 + 0.8 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.25)
    return module


def _compare(case, rule, build, call, dtype, mutate=None):
    """(cosine of forced migrated vs original, kernel calls, fallback bit-identical) for one case."""
    folder = RULES / rule
    original = _load(folder / f"{case}.in.py", forced=False)
    forced = _load(folder / f"{case}.out.py", forced=True, mutate=mutate)
    fallback = _load(folder / f"{case}.out.py", forced=False)
    results = []
    for namespace in (original, forced, fallback):
        torch.manual_seed(0)
        subject = build(namespace)
        if isinstance(subject, torch.nn.Module):
            _perturb(subject, torch.Generator().manual_seed(1)).to(dtype)
        x = (3 * torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))).to(dtype)
        before = sum(TORCH_NPU.calls.values())
        results.append((call(subject, x), sum(TORCH_NPU.calls.values()) - before))
    (expected, _), (got, calls), (kept, _) = results
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected), calls, torch.equal(kept, expected)


def _with(module, **attributes):
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


def _module(name, *args, **kwargs):
    return lambda namespace: namespace[name](*args, **kwargs)


def _forward(module, x):
    return module(x)


# (rule, case, build, call, mutant of the generated code that must be caught)
CASES = {
    "qwen_fast_path": (
        "NPU701",
        "cuda_fast_path",
        _module("RMSNorm", 16),
        _forward,
        ("npu_rms_norm(x, self.weight,", "npu_rms_norm(x, torch.ones_like(self.weight),"),
    ),
    "functional_fp32_cast_back": (
        "NPU701",
        "functional",
        _module("FunctionalRMSNorm", 16),
        _forward,
        ("x.float(), self.scale.float(), epsilon", "x.float(), 1 + self.scale.float(), epsilon"),
    ),
    "functional_same_dtype": (
        "NPU701",
        "functional",
        _module("SameDtypeRMSNorm", 16),
        _forward,
        ("npu_rms_norm(x, self.weight, epsilon=self.eps)", "npu_rms_norm(x, self.weight.flip(0), epsilon=self.eps)"),
    ),
    "functional_weightless": (
        "NPU701",
        "functional",
        lambda namespace: namespace["qk_norm"],
        lambda fn, x: fn(x),
        ("x.new_ones(x.shape[-1:])", "x.new_ones(x.shape[-1:]).cumsum(0)"),
    ),
    "functional_tuple_of_an_attribute_shape": (
        "NPU701",
        "functional_attribute_shape",
        _module("TupleShapeNorm", 16),
        _forward,
        ("npu_rms_norm(x, self.weight, epsilon=self.eps)", "npu_rms_norm(x, self.weight.flip(0), epsilon=self.eps)"),
    ),
    "configurable_dim_unit_offset": (
        "NPU701",
        "configurable_dim",
        _module("RMSNorm", 16, add_unit_offset=True),
        _forward,
        ("(1 + self.weight if self.add_unit_offset else self.weight)", "self.weight"),
    ),
    "configurable_dim": (
        "NPU701",
        "configurable_dim",
        _module("RMSNorm", 16),
        _forward,
        ("(1 + self.weight if self.add_unit_offset else self.weight)", "(1 + self.weight)"),
    ),
    "two_projections_gate_second": (
        "NPU702",
        "two_projections",
        _module("QwenMLP", 16, 24),
        _forward,
        ("torch.cat((gate, up), dim=-1)", "torch.cat((up, gate), dim=-1)"),
    ),
    "one_projection": (
        "NPU702",
        "one_projection",
        _module("PackedSwiGLU", 16, 24),
        _forward,
        (
            "_npu_swiglu_halves(self.w12(x), -1)",
            "_npu_swiglu_halves(torch.cat(self.w12(x).chunk(2, -1)[::-1], -1), -1)",
        ),
    ),
    # A function with control flow: the gating statement gets a branch in its place (#23).
    "in_place_after_the_mlp_a_flag": (
        "NPU702",
        "control_flow_in_place",
        _module("ReducedMLP", 16, 24, halve_out=True),
        _forward,
        ("_npu_silu_mul(self.w1(x), self.w3(x))", "_npu_silu_mul(self.w3(x), self.w1(x))"),
    ),
    "in_place_in_an_expert_loop": (
        "NPU702",
        "control_flow_in_place",
        _module("LoopedExperts", 16, 24, 3),
        lambda experts, x: experts(x.reshape(-1, 16), [4, 0, 6]),
        ("_npu_swiglu_halves(projected, -1)", "_npu_swiglu_halves(projected.flip(-1), -1)"),
    ),
    # The split right in front, its halves read only by the product: one branch over both statements.
    "in_place_split_and_gate": (
        "NPU702",
        "control_flow_in_place",
        _module("RoutedExperts", 16, 24, 3),
        lambda experts, x: experts(x.reshape(-1, 16), torch.tensor([2, 0, 2, 1, 0, 2, 2, 0, 1, 2])),
        ("F.linear(x[rows], self.gate_up[expert]), -1)", "F.linear(x[rows], self.gate_up[expert]).flip(-1), -1)"),
    ),
    "in_place_gate_read_twice": (
        "NPU702",
        "fp32_gate_reads_dtype",
        _module("Fp32GateMLP", 16, 24),
        _forward,
        ("_npu_silu_mul(gate.float(), up.float())", "_npu_silu_mul(up.float(), gate.float())"),
    ),
    "in_place_activated_first": (
        "NPU702",
        "control_flow_in_place",
        _module("ActivatedFirst", 16, 24),
        lambda module, x: module(x, True),
        ("_npu_silu_mul(self.w1(x), self.w3(x))", "_npu_silu_mul(self.w3(x), self.w1(x))"),
    ),
    "in_place_gate_read_again": (
        "NPU702",
        "control_flow_in_place",
        lambda ns: _with(ns["GateKept"](), skip=False, proj=torch.nn.Linear(16, 48), out=torch.nn.Linear(24, 24)),
        _forward,
        ("_npu_silu_mul(gate, up)", "_npu_silu_mul(up, gate)"),
    ),
}


def _qwen_tables(seq, rot_dim):
    """Qwen's float32 tables, (1, S, 1, rot_dim) against BSND tensors, as a list [cos, sin]."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim)
    emb = torch.outer(torch.arange(seq).float(), inv_freq)
    emb = torch.cat((emb, emb), dim=-1)[None, :, None, :]
    return [emb.cos(), emb.sin()]


def _rotate_bsnd(fn, x):
    """Rotate the first half of each head of a (B, S, N, 16) view of x: a tail of 8 passes through."""
    return fn(x.reshape(2, 5, 2, 8).repeat(1, 1, 1, 2) * 3, _qwen_tables(5, 8))


def _half_tables(x_shape=(1, 5, 1, 8)):
    angles = torch.arange(5).float()[None, :, None, None] * torch.linspace(0.1, 1.5, x_shape[-1])
    return angles.expand(x_shape).cos(), angles.expand(x_shape).sin()


def _rotate_with_half_tables(fn, x):
    return fn(x.reshape(2, 5, 2, 8).repeat(1, 1, 1, 2) * 3, *(t.to(x.dtype) for t in _half_tables()))


def _rotate_with_sd_tables(fn, x):
    cos, sin = (t[0, :, 0].repeat(1, 2).to(x.dtype) for t in _half_tables())  # (S, D)
    return fn(x.reshape(2, 5, 2, 8).repeat(1, 1, 1, 2) * 3, cos, sin)


CASES.update(
    {
        "split_halves_minus_theta": (
            "NPU703",
            "split_halves",
            lambda namespace: namespace["rotate_split_halves"],
            _rotate_with_half_tables,
            ("_npu_sin = -sin.tile((2,))", "_npu_sin = sin.tile((2,))"),
        ),
        "split_halves_plus_theta": (
            "NPU703",
            "split_halves",
            lambda namespace: namespace["rotate_plus_theta"],
            _rotate_with_half_tables,
            ("_npu_sin = sin.tile((2,))\n", "_npu_sin = -sin.tile((2,))\n"),
        ),
        "split_halves_q_and_k": (
            "NPU703",
            "split_halves",
            lambda namespace: namespace["apply_rotary_qk"],
            lambda fn, x: torch.cat(
                _rotate_with_half_tables(lambda t, c, s: fn(t, t.flip(-1), c[:, :, 0], s[:, :, 0]), x)
            ),
            ("_npu_rotary_mul(q, _npu_cos", "_npu_rotary_mul(q.flip(-1), _npu_cos"),
        ),
        "viewed_tables": (
            "NPU703",
            "split_halves",
            lambda namespace: namespace["rotate_viewed_tables"],
            _rotate_with_sd_tables,
            (
                '_npu_rotary_mul(x, _npu_cos, _npu_sin, rotary_mode="half")\n    cos = cos.view',
                '_npu_rotary_mul(x, _npu_sin, _npu_cos, rotary_mode="half")\n    cos = cos.view',
            ),
        ),
    }
)


def _rotate_pairs_with_element_tables(fn, x):
    # (1, S, 1, D) float32, per pair: the original rotates `x.float()`, as diffusers does.
    cos, sin = (t.repeat_interleave(2, -1) for t in _half_tables())
    return fn(x.reshape(2, 5, 2, 8).repeat(1, 1, 1, 2) * 3, cos, sin)


CASES["real_pairs_interleaved"] = (
    "NPU703",
    "real_pairs",
    lambda namespace: namespace["rotate_unbound_pairs"],
    _rotate_pairs_with_element_tables,
    ('_npu_x0, cos, sin, rotary_mode="interleave")', '_npu_x0, cos, sin, rotary_mode="half")'),
)

CASES["pair_formulas"] = (
    "NPU703",
    "real_pairs",
    lambda namespace: namespace["rotate_pair_formulas"],
    _rotate_with_half_tables,
    ("_npu_sin = sin.repeat_interleave(2, dim=-1)", "_npu_sin = -sin.repeat_interleave(2, dim=-1)"),
)

# Qwen spells rotate_half with einops (in the integration extra).
CASES["qwen_partial_rotary"] = (
    "NPU703",
    "qwen_partial_rotary",
    lambda namespace: namespace["apply_rotary_pos_emb"],
    _rotate_bsnd,
    ('freqs[0], freqs[1], rotary_mode="half"', 'freqs[0], -freqs[1], rotary_mode="half"'),
)


#: Cases whose function runs the kernel more than once: q and k; once per expert that has tokens.
KERNEL_CALLS = {"split_halves_q_and_k": 2, "in_place_in_an_expert_loop": 2, "in_place_split_and_gate": 3}


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", CASES)
def test_branch_agrees_with_the_original_and_the_fallback_is_untouched(name, dtype, floor):
    rule, case, build, call, _ = CASES[name]
    cosine, calls, fallback_identical = _compare(case, rule, build, call, dtype)
    assert calls == KERNEL_CALLS.get(name, 1), "the fused kernel must run once per rotated tensor, norm or MLP"
    assert cosine >= floor
    assert fallback_identical


@pytest.mark.parametrize("name", CASES)
def test_a_broken_rewrite_is_caught(name):
    rule, case, build, call, mutant = CASES[name]
    cosine, calls, _ = _compare(case, rule, build, call, torch.float32, mutate=mutant)
    assert calls == KERNEL_CALLS.get(name, 1)
    assert cosine < 0.999


def test_a_dim_other_than_the_last_keeps_the_original_code():
    original = _load(RULES / "NPU701" / "configurable_dim.in.py", forced=False)
    forced = _load(RULES / "NPU701" / "configurable_dim.out.py", forced=True)
    x = torch.randn(16, 3, 16)  # the weight fits the last dim: only the dim guard can decline
    before = TORCH_NPU.calls["npu_rms_norm"]
    expected = original["RMSNorm"](16, dim=0)(x)
    assert torch.equal(forced["RMSNorm"](16, dim=0)(x), expected)
    assert TORCH_NPU.calls["npu_rms_norm"] == before


# -- NPU704: hand-written attention -----------------------------------------------------------------


def _keep(*shape, seed=4):
    """A bool mask, True where a query attends, with a kept and a dropped key in every row: neither it nor
    its inverse drops a whole row (which the branch leaves to the original code)."""
    keep = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    keep[..., 0], keep[..., -1] = True, False
    return keep


def _additive(keep, dtype, fill=float("-inf")):
    """The float form of `keep`: 0 where it attends, `fill` where it does not."""
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


def _bnsd(dtype, shape=(2, 4, 6, 16)):
    g = torch.Generator().manual_seed(5)
    return tuple((2 * torch.randn(shape, generator=g)).to(dtype) for _ in range(3))


def _module_call(name, *args, **kwargs):
    """A module of the fixture, perturbed and in `dtype`, called on (2, 6, dim) inputs and `extra(dtype)`."""

    def run(namespace, dtype, extra):
        torch.manual_seed(0)
        module = _perturb(namespace[name](*args, **kwargs).eval(), torch.Generator().manual_seed(1)).to(dtype)
        x = torch.randn(2, 6, args[0], generator=torch.Generator().manual_seed(2)).to(dtype)
        return module(x, *extra(dtype))

    return run


def _function_call(name, inputs, **kwargs):
    return lambda namespace, dtype, extra: namespace[name](*inputs(dtype), *extra(dtype), **kwargs)


# case -> (fixture, how to call it, its extra arguments by dtype, mutant of the generated code that must be caught)
EAGER_CASES = {
    "bsnd_weights_discarded": (
        "eager_weights_discarded",
        _module_call("SelfAttention", 64, 4),
        lambda dtype: (_additive(_keep(2, 1, 6, 6), dtype),),
        ("1.0 / math.sqrt(q.size(-1)),\n", "1.0,\n"),  # the scale left out
    ),
    "output_attentions_false": (
        "eager_output_attentions",
        _function_call("attention", _bnsd),
        lambda dtype: (_keep(6, 6),),
        ("query, key, value, None, ~causal,", "query, key, value, None, causal,"),  # the mask inverted
    ),
    "additive_0_inf": (
        "eager_masks",
        _function_call("additive_mask", _bnsd),
        lambda dtype: (_additive(_keep(2, 1, 6, 6), dtype),),
        ("query, key, value, keep, float(dropout_p)", "query, key, value, dropped, float(dropout_p)"),
    ),
    "mask_built_with_finfo_min": (
        "eager_masks",
        _function_call("mask_from_bool", _bnsd),
        lambda dtype: (_keep(2, 4, 6, 6),),
        ("(q, k, v, mask, None, 0.0, 1.0 / math.sqrt(k.size(-1)))", "(q, k, v, mask, None, 0.0, 1.0)"),
    ),
    "causal_or_padding": (
        "eager_masks",
        _module_call("CausalSelfAttention", 32, 2),
        lambda dtype: (_additive(torch.arange(6) < 5, dtype).expand(2, 1, 1, 6),),
        # The causal condition dropped where a padding mask is given too: the two are not OR-ed.
        ("dropped = lowest if dropped is None else dropped | lowest", "dropped = lowest"),
    ),
    "bias_that_is_a_mask": (
        "eager_bias",
        _function_call("attend_with_bias", _bnsd),
        lambda dtype: (_additive(_keep(1, 1, 6, 6), dtype, torch.finfo(dtype).min),),
        ("(q, k, v, position_bias, None, 0.0, q.size(-1) ** (-0.5))", "(q, k, v, position_bias, None, 0.0, 1.0)"),
    ),
    # Scores and output written as einsums (#23): torch's named axes in a module, one-letter axes with an
    # additive mask, einops' einsum.
    "einsum_module": (
        "einsum_scores",
        _module_call("EinsumAttention", 64, 4, 16),
        lambda dtype: (),
        ("(q, k, v, None, None, 0.0, self.scale)", "(q, k, v, None, None, 0.0, 1.0)"),
    ),
    "einsum_compact_additive_mask": (
        "einsum_scores",
        _function_call("compact_spelling", _bnsd),
        lambda dtype: (_additive(_keep(2, 1, 6, 6), dtype),),
        ("(q, k, v, bias, None,", "(q, v, k, bias, None,"),
    ),
    "einsum_channels_first": (
        "einsum_scores",
        _function_call("channels_first", lambda dtype: _bnsd(dtype, (2, 4, 16, 6))),
        lambda dtype: (),
        ("v.transpose(-2, -1),\n", "v.transpose(-2, -1).flip(-2),\n"),
    ),
    "einsum_sequence_first": (
        "einsum_scores",
        _function_call("sequence_first", lambda dtype: _bnsd(dtype, (2, 6, 4, 16))),
        lambda dtype: (),
        ("k.transpose(1, 2),\n", "k.transpose(1, 2).flip(-2),\n"),
    ),
    "einsum_any_leading_dims": (
        "einsum_scores",
        _function_call("any_leading_dims", _bnsd),
        lambda dtype: (),
        ("(q, k, v, None, None, 0.0,", "(q, k, k, None, None, 0.0,"),
    ),
    # Heads folded into the batch, (batch * heads, seq, dim): one head each for the kernel.
    "einsum_heads_folded": (
        "einsum_scores",
        _function_call("heads_folded", lambda dtype: _bnsd(dtype, (8, 6, 16))),
        lambda dtype: (),
        ("v.unsqueeze(1), None", "v.unsqueeze(1).flip(-2), None"),
    ),
    "bmm_heads_folded": (
        "einsum_scores",
        _function_call("batched_matmuls_unmasked", lambda dtype: _bnsd(dtype, (8, 6, 16))),
        lambda dtype: (),
        ("return fused_attention.squeeze(1)", "return fused_attention.squeeze(1).flip(0)"),
    ),
    # A mask under lucidrains' `exists(mask)`, filled with `max_neg_value(sim)` / `-finfo.max` (#23).
    "exists_mask_helper": (
        "exists_mask",
        _function_call("attend", _bnsd),
        lambda dtype: (_keep(2, 1, 6, 6),),
        ("~mask if exists(mask) else None", "mask if exists(mask) else None"),
    ),
    "exists_mask_finfo_max": (
        "exists_mask",
        _function_call("attend_finfo_max", _bnsd),
        lambda dtype: (_keep(2, 1, 6, 6),),
        ("~mask if exists(mask) else None", "None"),
    ),
    "exists_key_padding_rearranged": (
        "exists_mask",
        _function_call("attend_key_padding", _bnsd),
        lambda dtype: (torch.arange(6).expand(2, 6) < torch.tensor([[6], [4]]),),
        ('~rearrange(mask, "b j -> b 1 1 j") if', '~rearrange(mask.flip(-1), "b j -> b 1 1 j") if'),
    ),
    "einsum_keys_first": (
        "einsum_scores",
        _function_call("keys_first", _bnsd),
        lambda dtype: (),
        ("fused_attention = _npu_eager_attention(q, k, v,", "fused_attention = _npu_eager_attention(k, q, v,"),
    ),
    "einsum_multi_query": (
        "einsum_scores",
        _function_call("multi_query", lambda dtype: (_bnsd(dtype)[0], *(t[:, 0] for t in _bnsd(dtype)[1:]))),
        lambda dtype: (),
        ("k.unsqueeze(1), v.unsqueeze(1)", "k.unsqueeze(1).flip(-2), v.unsqueeze(1)"),
    ),
    "einops_einsum": (
        "einsum_scores",
        _function_call("einops_spelling", _bnsd),
        lambda dtype: (),
        ("(q, k, v, None, None, 0.0, q.shape[-1] ** (-0.5))", "(q, k, v, None, None, 0.0, q.shape[-1] ** 0.5)"),
    ),
}


def _eager_compare(name, dtype, mutate=None, extra=None):
    """(cosine of the forced branch vs the original, kernel calls, fallback bit-identical) for one case; the
    output alone is compared (the branch returns None for probabilities nobody takes)."""
    case, call, default_extra, _ = EAGER_CASES[name]
    extra = extra or default_extra
    folder = RULES / "NPU704"
    namespaces = (
        _load(folder / f"{case}.in.py", forced=False),
        _load(folder / f"{case}.out.py", forced=True, mutate=mutate),
        _load(folder / f"{case}.out.py", forced=False),
    )
    results = []
    for namespace in namespaces:
        before = TORCH_NPU.calls["npu_fusion_attention"]
        with torch.no_grad():
            result = call(namespace, dtype, extra)
        output = result[0] if isinstance(result, tuple) else result
        results.append((output, TORCH_NPU.calls["npu_fusion_attention"] - before))
    (expected, _), (got, calls), (kept, _) = results
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected), calls, torch.equal(kept, expected)


@pytest.mark.parametrize("dtype, floor", [(torch.float16, 0.999), (torch.bfloat16, 0.99)], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", EAGER_CASES)
def test_eager_attention_branch_agrees_with_the_original(name, dtype, floor):
    cosine, calls, fallback_identical = _eager_compare(name, dtype)
    assert calls == 1
    assert cosine >= floor
    assert fallback_identical


@pytest.mark.parametrize("name", EAGER_CASES)
def test_eager_attention_broken_rewrite_is_caught(name):
    cosine, calls, _ = _eager_compare(name, torch.float16, mutate=EAGER_CASES[name][3])
    assert calls == 1
    assert cosine < 0.999


@pytest.mark.parametrize("name", EAGER_CASES)
def test_eager_attention_in_fp32_runs_the_original(name):
    """The kernel path takes fp16 and bf16, as the SDPA wrapper's does: fp32 keeps the original's bits."""
    cosine, calls, fallback_identical = _eager_compare(name, torch.float32)
    assert calls == 0 and cosine == pytest.approx(1.0) and fallback_identical


@pytest.mark.parametrize(
    "name, why, extra",
    [
        (
            "bias_that_is_a_mask",
            "a real bias (ALiBi-like)",
            lambda dtype: (torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(6)).to(dtype),),
        ),
        (
            "additive_0_inf",
            "a mask of -10000 instead of -inf",
            lambda dtype: (_additive(_keep(2, 1, 6, 6), dtype, -10000.0),),
        ),
        ("additive_0_inf", "a row that drops every key", lambda dtype: (_additive(torch.zeros(6, 6).bool(), dtype),)),
        ("output_attentions_false", "a row that drops every key", lambda dtype: (torch.ones(6, 6).bool().tril(-1),)),
    ],
)
def test_eager_attention_masks_the_kernel_cannot_take_run_the_original(name, why, extra):
    cosine, calls, _ = _eager_compare(name, torch.float16, extra=extra)
    assert calls == 0, why
    assert cosine == pytest.approx(1.0) or cosine != cosine  # NaN rows (all -inf) stay NaN, as in the original


def test_eager_attention_weights_wanted_or_head_mask_run_the_original():
    original = _load(RULES / "NPU704" / "eager_output_attentions.in.py", forced=False)["attention"]
    migrated = _load(RULES / "NPU704" / "eager_output_attentions.out.py", forced=True)["attention"]
    q, k, v = _bnsd(torch.float16)
    causal = _keep(6, 6)
    for kwargs in ({"output_attentions": True}, {"head_mask": torch.rand(1, 4, 1, 1).half()}):
        before = TORCH_NPU.calls["npu_fusion_attention"]
        got, expected = migrated(q, k, v, causal, **kwargs), original(q, k, v, causal, **kwargs)
        assert TORCH_NPU.calls["npu_fusion_attention"] == before, kwargs
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


# -- our own Qwen-7B-shaped model, migrated as a user would ------------------------------------------

PROJECT = FIXTURES / "projects" / "qwen_like"
#: Sites of `qwen_like/modeling.py` by op and status: the norm class, both MLPs and the partial rotary
#: fused; `_attn` declined: it returns the probabilities, and no parameter says when they are not wanted
#: (its one caller here discards them, but a subclass or another module could call it and keep them).
EXPECTED_SITES = {
    ("torch_npu.npu_rms_norm", "applied"): 1,
    ("torch_npu.npu_swiglu", "applied"): 2,
    ("torch_npu.npu_rotary_mul", "applied"): 1,
    ("torch_npu.npu_fusion_attention", "declined"): 1,
}


def _npu_migrate(*args):
    return subprocess.run([sys.executable, "-m", "npu_migrate", *args], capture_output=True, text=True, check=False)


def _sites(data):
    if isinstance(data, dict):
        if "sites" in data:
            return data["sites"]
        data = list(data.values())
    for value in data if isinstance(data, list) else ():
        found = _sites(value)
        if found is not None:
            return found
    return None


def test_qwen_like_recall_by_op():
    result = _npu_migrate("analyze", "--mode", "affinity_apis", "--format", "json", str(PROJECT))
    counts: dict[tuple[str, str], int] = {}
    for site in _sites(json.loads(result.stdout)):
        key = (site["affinity_api"], site["status"])
        counts[key] = counts.get(key, 0) + 1
    print("qwen_like affinity sites:", {f"{op} {status}": n for (op, status), n in sorted(counts.items())})
    assert counts == EXPECTED_SITES


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
def test_qwen_like_block_migrated_with_apply_output(tmp_path, monkeypatch, dtype, floor):
    result = _npu_migrate("apply", str(PROJECT), "--output", str(tmp_path / "migrated"))
    assert result.returncode in (0, 1), result.stderr
    monkeypatch.syspath_prepend(str(tmp_path / "migrated"))
    for name in [m for m in sys.modules if m == "qwen_like" or m.startswith("qwen_like.")]:
        monkeypatch.delitem(sys.modules, name)
    migrated = importlib.import_module("qwen_like.modeling")
    assert migrated.__file__.startswith(str(tmp_path))
    original = {"__name__": "qwen_like_original"}
    source = PROJECT / "qwen_like" / "modeling.py"
    exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), original)

    def run(namespace_block, x):
        torch.manual_seed(0)
        block = _perturb(namespace_block(), torch.Generator().manual_seed(1)).to(dtype)
        return block(x, original["rotary_tables"](5, 8))  # float32 tables, as Qwen keeps them

    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    expected = run(original["QBlock"], x)
    assert torch.equal(run(migrated.QBlock, x), expected), "off an NPU the migrated model gives the same bits"
    # The kernels reach `torch_npu` where the helpers are: inline, as `modeling.py` proves no package (it has
    # no relative import), or in a helper module it imports.
    helpers = importlib.import_module(migrated._npu_rms_norm.__module__)
    assert migrated._npu_rms_norm is helpers._npu_rms_norm
    monkeypatch.setattr(migrated, "_is_npu", lambda t: True)
    monkeypatch.setattr(helpers, "_is_npu", lambda t: True)
    monkeypatch.setattr(helpers, "torch_npu", TORCH_NPU)
    before = dict(TORCH_NPU.calls)
    got = run(migrated.QBlock, x)
    ops = ("npu_rms_norm", "npu_swiglu", "npu_rotary_mul", "npu_fusion_attention")
    calls = {k: TORCH_NPU.calls[k] - before.get(k, 0) for k in ops}
    assert calls == {"npu_rms_norm": 2, "npu_swiglu": 2, "npu_rotary_mul": 2, "npu_fusion_attention": 0}
    assert _cosine(got, expected) >= floor


def test_hand_written_attention_is_reported_once_with_its_true_reason():
    from npu_migrate.engine.pipeline import migrate_text

    case = RULES / "NPU704" / "hand_written_reasons.in.py"
    _, findings = migrate_text(case.read_text(encoding="utf-8"), path="attention.py", select=["NPU704"])
    by_line = {f.line: f.message for f in findings if f.rule_id == "NPU704"}
    assert "gets a fused `torch_npu.npu_fusion_attention` branch" in by_line[8]
    assert "returns the attention probabilities" in by_line[16] and "says when they are not wanted" in by_line[16]
    # Line 1: the helpers; line 30: the class's SDPA call, wrapped. Its fallback body gets no finding.
    assert sorted(by_line) == [1, 8, 16, 30]


@pytest.mark.parametrize(
    "case, expected",
    [
        (
            "eager_bias",
            {
                12: "an additive term computed here (`alibi(slopes, q.size(-2))`): a bias such as ALiBi",
                19: "gets a fused `torch_npu.npu_fusion_attention` branch",
                25: "masked scores are set to `-1000000000.0`, not -inf or the dtype's lowest",
                32: "it scales the scores after masking them",
            },
        ),
        (
            "eager_weights_discarded",
            {
                19: "gets a fused `torch_npu.npu_fusion_attention` branch",
                38: "returns the attention probabilities, which npu_fusion_attention does not compute, and no "
                "parameter (`output_attentions` / `need_weights`) says when they are not wanted",
            },
        ),
        (
            # Spellings from vision models (timm's talking heads, channel attention, global context).
            "eager_layouts",
            {
                14: "the probabilities go through `self.mix_probs(...)` before `@ v`",
                22: "the scores are not `q @ k.transpose(-2, -1)`",
                # Line 36, a softmax over a convolution pooling the input, is no attention: not reported.
                51: "the attention is computed inside `if self.use_conv:`",
            },
        ),
    ],
)
def test_hand_written_attention_declines_say_why(case, expected):
    from npu_migrate.engine.pipeline import migrate_text

    source = (RULES / "NPU704" / f"{case}.in.py").read_text(encoding="utf-8")
    _, findings = migrate_text(source, path="attention.py", select=["NPU704"])
    by_line = {f.line: f.message for f in findings if f.rule_id == "NPU704" and f.line != 1}
    assert sorted(by_line) == sorted(expected)
    for line, reason in expected.items():
        assert reason in by_line[line]


def test_a_file_with_its_own_npu_attention_path_gets_no_second_one():
    from npu_migrate.engine.pipeline import migrate_text

    case = RULES / "NPU707" / "own_npu_backend.in.py"
    source = case.read_text(encoding="utf-8")
    migrated, findings = migrate_text(source, path="attention_dispatch.py", select=["NPU707"])
    assert migrated == source
    assert [f.message for f in findings if f.rule_id == "NPU707"] == [
        "scaled_dot_product_attention not wrapped, here or at the file's other calls: this file already calls "
        "torch_npu's npu_fusion_attention (its own NPU path); to fuse it, select that path on an NPU"
    ], "one finding for the file's two calls: diffusers' attention_processor.py has 32"


def test_split_halves_with_number_tables_runs_the_original():
    """A fixed angle as Python numbers: the branch must not build tables (`torch.cat`) from them."""
    original = _load(RULES / "NPU703" / "split_halves.in.py", forced=False)
    forced = _load(RULES / "NPU703" / "split_halves.out.py", forced=True)
    x = torch.randn(2, 5, 2, 16)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    expected = original["rotate_split_halves"](x, 0.6, 0.8)
    assert torch.equal(forced["rotate_split_halves"](x, 0.6, 0.8), expected)
    assert TORCH_NPU.calls["npu_rotary_mul"] == before


def test_a_long_quoted_expression_in_a_declined_finding_shows_its_start_and_end():
    from npu_migrate.transforms.fused.symbolic import QUOTE_LIMIT, brief

    long = "a" * 60 + "MIDDLE" + "z" * 60
    cut = brief(f"the scores go through `{long}` where `mask is not None`")
    quoted = cut.split("`")[1]
    assert len(quoted) <= QUOTE_LIMIT and quoted.startswith("a" * 20) and quoted.endswith("z" * 16)
    assert "MIDDLE" not in cut and cut.endswith("where `mask is not None`"), "short spans stay whole"


def test_an_einsum_over_any_leading_dims_runs_the_original_on_3d_tensors():
    """`... i d, ... j d -> ... i j` is read whatever the leading dims; the kernel takes 4-D alone."""
    original = _load(RULES / "NPU704" / "einsum_scores.in.py", forced=False)
    forced = _load(RULES / "NPU704" / "einsum_scores.out.py", forced=True)
    q, k, v = (t[0] for t in _bnsd(torch.float16))  # (heads, seq, dim)
    before = TORCH_NPU.calls["npu_fusion_attention"]
    assert torch.equal(forced["any_leading_dims"](q, k, v), original["any_leading_dims"](q, k, v))
    assert TORCH_NPU.calls["npu_fusion_attention"] == before
