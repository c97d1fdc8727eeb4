"""Migrated fused-op code keeps working under TorchScript, FX and torch.compile, on a host without an NPU.

Every NPU70x fixture with a rewrite is loaded twice, original (`.in.py`) and migrated (`.out.py`): whatever
graph mode the original survives (`torch.jit.script` with a save/load round trip, `torch.fx.symbolic_trace`,
`torch.compile(backend="eager")`), the migrated code must survive too and compute the same, bit for bit.
Each mode runs with torch_npu absent (the helpers' `torch_npu` is None) and present as a dummy module, as on
an NPU host whose tensors are elsewhere: FX used to trip over the branch only when torch_npu imported.
"""

from __future__ import annotations

import importlib.util
import io
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

RULES = FIXTURES / "rules"


def _rotary(batch=1, heads=2, seq=5, dim=8):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(batch, heads, seq, dim, generator=g), torch.randn(batch, heads, seq, dim, generator=g)
    freqs = torch.arange(seq).float()[:, None] / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    emb = torch.cat((freqs, freqs), -1)[None]
    return q, k, emb.cos(), emb.sin()


def _width_from_table():
    """x [seq, batch, heads, head_dim] = [5, 1, 2, 8], half of each head rotated by a (positions, 1, 2, 2)
    cache of (cos, sin) pairs."""
    theta = torch.rand(6, 1, 2, generator=torch.Generator().manual_seed(3)) * 3
    return torch.randn(5, 1, 2, 8, generator=torch.Generator().manual_seed(4)), torch.stack(
        (theta.cos(), theta.sin()), -1
    )


def _moved_dim():
    """x (batch, heads, dim, seq) = (1, 2, 8, 5), a (1, 1, seq, dim / 2) complex table."""
    theta = torch.rand(1, 1, 5, 4, generator=torch.Generator().manual_seed(5)) * 3
    return torch.randn(1, 2, 8, 5, generator=torch.Generator().manual_seed(6)), torch.polar(
        torch.ones_like(theta), theta
    )


def _angles():
    """Angles per pair, repeated per element: (1, 1, seq, dim), for einops_conditional's interleaved pairs."""
    return torch.rand(1, 1, 5, 4, generator=torch.Generator().manual_seed(7)).repeat_interleave(2, -1) * 3


def _attention(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(2, 4, 6, 8, generator=g).to(dtype) for _ in range(3))


def _float_mask(*shape):
    """0 where a query attends, -inf where it does not (never a whole row)."""
    keep = torch.rand(*shape, generator=torch.Generator().manual_seed(2)) > 0.4
    keep[..., 0] = True
    return torch.zeros(shape).masked_fill(~keep, float("-inf"))


def _linear(module, name, features_in, features_out):
    setattr(module, name, torch.nn.Linear(features_in, features_out))
    return module


#: (rule, fixture, entry point, builds the callable from the fixture's namespace, its inputs)
CASES = [
    ("NPU701", "gemma_norm_method", lambda ns: ns["ScaledNorm"](8), lambda: (torch.randn(2, 3, 8),)),
    ("NPU701", "llama_style", lambda ns: ns["RMSNorm"](8), lambda: (torch.randn(2, 3, 8).bfloat16(),)),
    ("NPU701", "plain_function", lambda ns: ns["rms_norm"], lambda: (torch.randn(2, 8), torch.rand(8), 1e-6)),
    (
        "NPU701",
        "sqrt_division",
        lambda ns: _with(ns["Norm"](), scale=torch.nn.Parameter(torch.rand(8))),
        lambda: (torch.randn(2, 8),),
    ),
    (
        "NPU702",
        "act_fn_attribute",
        lambda ns: ns["MLP"](types.SimpleNamespace(hidden_size=8, intermediate_size=16, hidden_act="silu")),
        lambda: (torch.randn(2, 8),),
    ),
    (
        "NPU702",
        "functional_silu_right",
        lambda ns: _with(
            ns["FeedForward"](), w1=torch.nn.Linear(8, 16), w2=torch.nn.Linear(16, 8), w3=torch.nn.Linear(8, 16)
        ),
        lambda: (torch.randn(2, 8),),
    ),
    # eps omitted: the branch passes float32's eps as a literal (TorchScript has no torch.finfo)
    ("NPU701", "functional_default_eps", lambda ns: ns["NoEps"](8), lambda: (torch.randn(2, 8),)),
    ("NPU702", "silu_module", lambda ns: ns["GatedMLP"](8, 16), lambda: (torch.randn(2, 8),)),
    ("NPU702", "torch_chunk", lambda ns: ns["swiglu"], lambda: (torch.randn(2, 16),)),
    # A branch in place of the gating statement of a function with control flow.
    ("NPU702", "control_flow_in_place", lambda ns: ns["ReducedMLP"](8, 16, True), lambda: (torch.randn(2, 8),)),
    ("NPU703", "double_negation", lambda ns: ns["apply_rotary_pos_emb"], lambda: _pick(_rotary(), 0, 2, 3, head=1)),
    ("NPU703", "hf_apply_rotary_pos_emb", lambda ns: ns["apply_rotary_pos_emb"], _rotary),
    ("NPU703", "partial_rotary", lambda ns: ns["apply_rotary_pos_emb"], _rotary),
    ("NPU703", "upcast_interleaved", lambda ns: ns["apply_rotary_pos_emb"], _rotary),
    ("NPU703", "renamed_chunk_helper", lambda ns: ns["rope"], lambda: _pick(_rotary(), 0, 2, 3, head=1)),
    ("NPU703", "rotary_module", lambda ns: ns["Rotary"](), lambda: _pick(_rotary(), 0, 2, 3, head=1)),
    ("NPU703", "gptj_interleaved", lambda ns: ns["apply_rotary_pos_emb"], lambda: _pick(_rotary(), 0, 3, 2, head=1)),
    # The branch after an `if` that prepares the tables (old HF), and scaled einops tables.
    ("NPU703", "control_flow", lambda ns: ns["apply_rotary_pos_emb"], _rotary),
    ("NPU703", "einops_interleaved", lambda ns: ns["rotate_scaled"], lambda: (*_pick(_rotary(), 0, 2, head=1), 0.5)),
    ("NPU703", "every_other_pairs", lambda ns: ns["apply_every_other"], lambda: _pick(_rotary(), 0, 2, 3, head=1)),
    # A rotated width read from the table (ChatGLM), a rotation of a moved dim (Sana-WM), a branch per way
    # through `if`s on parameters (diffusers' `use_real`, a flag).
    ("NPU703", "width_from_table", lambda ns: ns["rotate_table_width"], lambda: _width_from_table()),
    ("NPU703", "moved_dim", lambda ns: ns["rotate_features"], lambda: _moved_dim()),
    (
        "NPU703",
        "real_or_complex_branch",
        lambda ns: ns["apply_rotary"],
        lambda: (_rotary()[0], _pick(_rotary(), 2, 3, head=1), True),
    ),
    ("NPU703", "einops_conditional", lambda ns: ns["rotate_when"], lambda: (_rotary()[0], _angles(), True)),
    # q and k rotated by a helper, each with tables of its own (the cache cut to its length, xpos' scales).
    (
        "NPU703",
        "qk_window_helper",
        lambda ns: ns["apply_rotary_cached"],
        lambda: (_width_from_table()[0], _width_from_table()[0][:3], _width_from_table()[1]),
    ),
    (
        "NPU703",
        "qk_window_helper",
        lambda ns: ns["apply_xpos"],
        lambda: (*_rotary()[:2], _rotary()[2], _rotary()[3] + 1),
    ),
    (
        "NPU707",
        "sdpa_functional",
        lambda ns: ns["attend"],
        lambda: (*_attention(torch.float16), torch.ones(6, 6, dtype=torch.bool).tril()),
    ),
    ("NPU707", "sdpa_functional", lambda ns: ns["causal"], lambda: _attention(torch.bfloat16)),
    ("NPU707", "sdpa_module", lambda ns: ns["SelfAttention"]().eval(), lambda: (torch.randn(2, 5, 64),)),
    ("NPU707", "sdpa_torch_path", lambda ns: ns["attention"], lambda: (*_attention(), None)),
    ("NPU707", "torchscript", lambda ns: ns["attend"], _attention),
    (
        "NPU704",
        "eager_weights_discarded",
        lambda ns: ns["SelfAttention"](64, 4).eval(),
        lambda: (torch.randn(2, 6, 64), _float_mask(2, 1, 6, 6)),
    ),
    (
        "NPU704",
        "eager_output_attentions",
        lambda ns: ns["attention"],
        lambda: (*_attention(), torch.ones(6, 6, dtype=torch.bool).tril()),
    ),
    ("NPU704", "eager_masks", lambda ns: ns["additive_mask"], lambda: (*_attention(), _float_mask(2, 1, 6, 6))),
    ("NPU704", "eager_bias", lambda ns: ns["attend_with_bias"], lambda: (*_attention(), torch.randn(1, 4, 6, 6))),
    ("NPU704", "hand_written_reasons", lambda ns: ns["attend_output_only"], lambda: (*_attention(), _float_mask(6, 6))),
    # Attention written with einsums, 4-D and with the heads folded into the batch (#23).
    ("NPU704", "einsum_scores", lambda ns: ns["compact_spelling"], lambda: (*_attention(), _float_mask(2, 1, 6, 6))),
    ("NPU704", "einsum_scores", lambda ns: ns["heads_folded"], lambda: tuple(t.flatten(0, 1) for t in _attention())),
    ("NPU704", "einsum_scores", lambda ns: ns["batched_matmuls_unmasked"], lambda: tuple(t[0] for t in _attention())),
]


#: Where the original code itself fails, whatever the migration does.
ORIGINAL_FAILS = {
    # `unsqueeze_dim=1` is not annotated: TorchScript takes it for a Tensor.
    ("hf_apply_rotary_pos_emb", "jit.script"),
    ("partial_rotary", "jit.script"),
    ("upcast_interleaved", "jit.script"),
    ("control_flow", "jit.script"),  # `position_ids=None` is not annotated either
    ("einops_interleaved", "jit.script"),  # einops is not scriptable
    ("einops_conditional", "jit.script"),
    ("einops_conditional", "fx.symbolic_trace"),  # `if enabled:` of a proxy
    ("real_or_complex_branch", "jit.script"),  # `cos, sin = freqs`: freqs is taken for a Tensor
    ("real_or_complex_branch", "fx.symbolic_trace"),  # `if use_real:` of a proxy
    ("einops_interleaved", "fx.symbolic_trace"),  # nor traceable: "Tensor type unknown to einops"
    ("sdpa_module", "jit.script"),  # SDPA's enable_gqa under TorchScript on CPU
    ("sdpa_torch_path", "jit.script"),  # **kwargs
    ("sdpa_torch_path", "fx.symbolic_trace"),  # **kwargs of a proxy
    ("torchscript", "fx.symbolic_trace"),  # already a ScriptFunction
    ("eager_output_attentions", "jit.script"),  # torch.finfo
    ("eager_output_attentions", "fx.symbolic_trace"),  # torch.finfo of a proxy's dtype
}


def _with(module, **attributes):
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


def _pick(tensors, *indices, head):
    """Some of `tensors`, the cos/sin tables (3-D) given the head axis at `head` (4-D)."""
    return tuple(t.unsqueeze(head) if t.dim() == 3 else t for t in (tensors[i] for i in indices))


def _with_future_annotations(path, folder):
    copy = folder / path.name
    copy.write_text("from __future__ import annotations\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    return copy


def _load(path, torch_npu):
    """The fixture imported as a module (TorchScript resolves annotations through `sys.modules`)."""
    name = f"_fixture_{path.parent.name}_{path.name.replace('.', '_')}_{len(_LOADED)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = _LOADED[name] = module
    spec.loader.exec_module(module)
    if hasattr(module, "_is_npu"):
        module.torch_npu = torch_npu
    return vars(module)


_LOADED: dict[str, types.ModuleType] = {}


def _scripted(fn, inputs):
    scripted = torch.jit.script(fn)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)(*inputs)


def _traced(fn, inputs):
    return torch.fx.symbolic_trace(fn)(*inputs)


def _compiled(fn, inputs):
    torch._dynamo.reset()
    return torch.compile(fn, backend="eager")(*inputs)


MODES = {"jit.script": _scripted, "fx.symbolic_trace": _traced, "compile(eager)": _compiled}


def _run(mode, fn, inputs):
    try:
        with torch.no_grad():
            return MODES[mode](fn, inputs), None
    except Exception as exc:  # noqa: BLE001 - which graph modes the original survives is what is measured
        return None, exc


@pytest.mark.parametrize("torch_npu", ["absent", "dummy", "absent-future-annotations"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_migrated_code_survives_every_graph_mode_the_original_does(case, mode, torch_npu, tmp_path):
    rule, name, build, inputs = case
    module = types.ModuleType("torch_npu") if torch_npu == "dummy" else None
    paths = [RULES / rule / f"{name}.{kind}.py" for kind in ("in", "out")]
    if torch_npu.endswith("future-annotations"):
        # String annotations: TorchScript cannot resolve them on `@torch.jit.unused` functions, hence the
        # helpers' type comments.
        paths = [_with_future_annotations(path, tmp_path) for path in paths]
    original = build(_load(paths[0], None))
    migrated = build(_load(paths[1], module))
    if isinstance(original, torch.nn.Module):
        migrated.load_state_dict(original.state_dict())
    args = inputs()
    expected, failure = _run(mode, original, args)
    assert (failure is None) == ((name, mode) not in ORIGINAL_FAILS), f"{name} before migration, {mode}: {failure!r}"
    if failure is not None:
        return  # the original does not survive this mode either: nothing to keep
    got, failure = _run(mode, migrated, args)
    assert failure is None, f"{name} survives {mode} before migration, not after: {failure!r}"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_scripted_sdpa_caller_imports_and_runs():
    """`@torch.jit.script` compiles at import: the renamed call must compile then, torch_npu absent."""
    namespace = _load(RULES / "NPU707" / "torchscript.out.py", None)
    q, k, v = _attention()
    torch.testing.assert_close(namespace["attend"](q, k, v), F.scaled_dot_product_attention(q, k, v), rtol=0, atol=0)
