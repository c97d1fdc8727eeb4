"""Issue #23: NPU704's injected mask arguments as a reviewer reads them.

mmpretrain 1.2.0's hivit `Attention.forward` got one 230-character argument repeating
`self.relative_position_index.view(-1)` three times: the substituted relative-position bias. Now a mask
argument that repeats a sub-expression or would not fit the line is bound to names in the branch, each
sub-expression once, under the condition the original computes it; and a learned bias (an `nn.Parameter`
table), which is never 0 / -inf and so always fell back, skips the branch where it is added, with a finding
saying so (declined where it is added on every call).

The modules below are our own, written for this test. The migrated code runs with `_is_npu` forced true and
the CPU reference kernels (`npu_migrate.verify.reference`) as `torch_npu`: in bf16 / fp16 the kernel is
called once and agrees with the original; in fp32 the kernel does not run and the output is bit-identical;
a branch whose bound mask is inverted is caught.
"""

from __future__ import annotations

import ast
import importlib
import textwrap

import pytest
import torch
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # torch: the `integration` extra

TORCH_NPU = reference.torch_npu_module()
FLOOR = {torch.float32: 0.999, torch.bfloat16: 0.99, torch.float16: 0.99}

#: The fixture's modules, one at a time (`fixtures/rules/NPU704/eager_bound_mask.in.py`, our own code), each
#: with the fixture's imports.
EAGER_BOUND_MASK = (FIXTURES / "rules" / "NPU704" / "eager_bound_mask.in.py").read_text(encoding="utf-8")


def _fixture_class(name: str) -> str:
    tree = ast.parse(EAGER_BOUND_MASK)
    imports = [
        ast.get_source_segment(EAGER_BOUND_MASK, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
    ]
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return "\n".join(imports) + "\n\n\n" + ast.get_source_segment(EAGER_BOUND_MASK, node) + "\n"


#: A padding mask turned into an additive one in the function (BERT's extended attention mask): substituted,
#: `keep[:, None, None, :].to(q.dtype)` appears twice in the argument.
PADDED = _fixture_class("PaddedHeads")

#: hivit's shape: a relative-position bias gathered from a learned table where `rel` is given, a padding
#: mask by `masked_fill`.
LEARNED = _fixture_class("TableHeads")


def _migrate(text):
    out, findings = migrate_text(text, path="heads.py", select=["NPU704"])
    return out, [f for f in findings if f.rule_id == "NPU704" and not f.message.startswith("fused-op helpers")]


def _branch(out: str) -> str:
    start = out.index("if _is_npu(")
    return out[start : out.index("if fused_attention is not None", start)]


def _build(text, name, dtype, *, forced, mutate=None, args=(64, 4)):
    if mutate is not None:
        assert mutate[0] in text, mutate
        text = text.replace(*mutate)
    namespace = {"__name__": "heads"}
    exec(compile(text, "heads.py", "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    torch.manual_seed(0)
    return namespace[name](*args).to(dtype).eval()


def _inputs(dtype, n=16):
    tokens = torch.randn(2, n, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    keep = torch.ones(2, n, dtype=torch.long)
    keep[0, 11:] = 0  # padding: every row keeps some keys
    keep[1, 5:9] = 0
    return tokens, keep


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def _run(module, *args):
    before = TORCH_NPU.calls["npu_fusion_attention"]
    with torch.no_grad():
        got = module(*args)
    return got, TORCH_NPU.calls["npu_fusion_attention"] - before


# -- a mask argument bound to names -------------------------------------------------------------------


def test_a_repeated_mask_argument_is_bound_once_under_its_condition_and_fits():
    out, findings = _migrate(PADDED)
    assert len(findings) == 1 and findings[0].fixed, [f.message for f in findings]
    branch = _branch(out)
    # each sub-expression computed once, under the test the original computes it under, None otherwise
    assert branch.count("keep[:, None, None, :]") == 1, branch
    lines = [line.strip() for line in branch.splitlines()]
    assert lines[1:6] == [
        "if keep is not None:",
        "fused_term = keep[:, None, None, :].to(q.dtype)",
        "fused_mask = (1.0 - fused_term) * torch.finfo(fused_term.dtype).min",
        "else:",
        "fused_mask = None",
    ], branch
    assert "q, k, v, fused_mask, None, 0.0" in branch, branch
    assert max(len(line) for line in out.splitlines()) <= 88  # the file's own width
    assert migrate_text(out, path="heads.py", select=["NPU704"])[0] == out


@pytest.mark.parametrize("dtype", list(FLOOR), ids=str)
@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no-mask"])
def test_the_bound_mask_agrees_and_the_fallback_is_bit_identical(dtype, masked):
    out, _ = _migrate(PADDED)
    tokens, keep = _inputs(dtype)
    args = (tokens, keep) if masked else (tokens,)
    with torch.no_grad():
        expected = _build(PADDED, "PaddedHeads", dtype, forced=False)(*args)
    got, calls = _run(_build(out, "PaddedHeads", dtype, forced=True), *args)
    assert got.dtype == expected.dtype and _cosine(got, expected) >= FLOOR[dtype]
    if dtype == torch.float32:
        assert calls == 0 and torch.equal(got, expected)  # the kernel takes fp16 / bf16 only
    else:
        assert calls == 1
    with torch.no_grad():  # off the NPU the migrated file is the original
        assert torch.equal(_build(out, "PaddedHeads", dtype, forced=False)(*args), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_bound_mask_that_is_inverted_is_caught(dtype):
    out, _ = _migrate(PADDED)
    broken = ("fused_mask = (1.0 - fused_term) *", "fused_mask = fused_term *")
    tokens, keep = _inputs(dtype)
    with torch.no_grad():
        expected = _build(PADDED, "PaddedHeads", dtype, forced=False)(tokens, keep)
    got, calls = _run(_build(out, "PaddedHeads", dtype, forced=True, mutate=broken), tokens, keep)
    assert calls == 1 and _cosine(got, expected) < FLOOR[dtype]


def test_the_branch_with_bindings_still_scripts_and_traces(tmp_path, monkeypatch):
    # TorchScript compiles the branch, the bound mask an Optional[Tensor] by its if / else; FX traces past it.
    # (`torch.finfo` does not script: float32's lowest written out, the argument bound for its length.)
    scriptable = PADDED.replace("torch.finfo(bias.dtype).min", "-3.4028234663852886e38")
    out, _ = _migrate(scriptable)
    assert "fused_mask = (1.0 - keep[:, None, None, :].to(q.dtype)) * -3.4028234663852886e+38" in out
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = {}
    for name, code in (("padded_in", scriptable), ("padded_out", out)):
        (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
        modules[name] = importlib.import_module(name)
    torch.manual_seed(0)
    original = modules["padded_in"].PaddedHeads(64, 4).eval()
    torch.manual_seed(0)
    migrated = modules["padded_out"].PaddedHeads(64, 4).eval()
    tokens, keep = _inputs(torch.float32)
    with torch.no_grad():
        expected = original(tokens, keep)
        assert torch.equal(torch.jit.script(migrated)(tokens, keep), expected)
        assert torch.equal(torch.fx.symbolic_trace(migrated)(tokens, keep), expected)


# -- a learned bias: the branch is skipped where it is added ------------------------------------------


def test_a_learned_bias_under_a_test_skips_the_branch_there_and_says_so():
    out, findings = _migrate(LEARNED)
    assert len(findings) == 1 and findings[0].fixed, [f.message for f in findings]
    assert "the branch is skipped where `rel is not None`" in findings[0].message
    assert "learned bias (from `self.table`)" in findings[0].message
    branch = _branch(out)
    assert branch.startswith("if _is_npu(q) and rel is None:"), branch
    assert "self.table" not in branch and "self.index" not in branch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_the_learned_bias_runs_the_original_and_the_rest_the_kernel(dtype):
    out, _ = _migrate(LEARNED)
    tokens, keep = _inputs(dtype)
    build = lambda text, forced: _build(text, "TableHeads", dtype, forced=forced, args=(64, 4, 4))  # noqa: E731
    with torch.no_grad():
        with_bias = build(LEARNED, False)(tokens, True, keep)
        without = build(LEARNED, False)(tokens, None, keep)
    # with the bias: never the kernel, the original's bits
    got, calls = _run(build(out, True), tokens, True, keep)
    assert calls == 0 and torch.equal(got, with_bias)
    # without it: the kernel, once (fp16 / bf16)
    got, calls = _run(build(out, True), tokens, None, keep)
    assert _cosine(got, without) >= FLOOR[dtype]
    assert calls == (0 if dtype == torch.float32 else 1)


def test_a_learned_bias_on_every_call_is_declined_with_the_reason():
    source = LEARNED.split("    def forward")[0] + textwrap.indent(
        textwrap.dedent(
            """\
            def forward(self, tokens):
                b, n, c = tokens.shape
                qkv = self.qkv(tokens).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
                q, k, v = qkv[0], qkv[1], qkv[2]
                attn = q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5
                attn = attn + self.table[self.index].permute(2, 0, 1)
                attn = attn.softmax(dim=-1)
                return self.out((attn @ v).transpose(1, 2).reshape(b, n, c))
            """
        ),
        "    ",
    )
    out, findings = _migrate(source)
    assert out == source
    assert len(findings) == 1 and not findings[0].fixed
    assert "learned bias (from `self.table`, an `nn.Parameter`) on every call" in findings[0].message, findings[
        0
    ].message


#: hivit's shape with a fixed table, 0 / -inf (a buffer, not trained): the bias argument is bound as the
#: original computes it (`fused_rel`, then `fused_S`), each once, and the kernel takes it.
FIXED = LEARNED.replace("class TableHeads", "class FixedTableHeads").replace(
    "self.table = nn.Parameter(torch.randn((2 * side - 1) ** 2, heads))",
    'self.register_buffer("table", torch.zeros((2 * side - 1) ** 2, heads).masked_fill('
    "torch.rand((2 * side - 1) ** 2, heads) < 0.2, float('-inf')))",
)


def test_a_fixed_table_bias_is_bound_as_the_original_computes_it():
    out, findings = _migrate(FIXED)
    assert len(findings) == 1 and findings[0].fixed and "skipped" not in findings[0].message
    lines = [line.strip() for line in _branch(out).splitlines()]
    assert lines[1:4] == [
        "if rel is not None:",
        "fused_rel = self.index.view(-1)",
        "fused_S = int(math.sqrt(fused_rel.size(-1)))",
    ], lines
    assert _branch(out).count("self.index") == 1


@pytest.mark.parametrize("dtype", list(FLOOR), ids=str)
def test_the_bound_table_bias_agrees_and_a_transposed_one_is_caught(dtype):
    out, _ = _migrate(FIXED)
    tokens, keep = _inputs(dtype)
    build = lambda text, forced, mutate=None: _build(  # noqa: E731
        text, "FixedTableHeads", dtype, forced=forced, mutate=mutate, args=(64, 4, 4)
    )
    with torch.no_grad():
        expected = build(FIXED, False)(tokens, True, keep)
    got, calls = _run(build(out, True), tokens, True, keep)
    assert _cosine(got, expected) >= FLOOR[dtype]
    if dtype == torch.float32:
        assert calls == 0 and torch.equal(got, expected)
        return
    assert calls == 1
    broken = (
        ".permute(0, 3, 1, 2).contiguous()\n            else:",
        ".permute(0, 3, 2, 1).contiguous()\n            else:",
    )
    got, calls = _run(build(out, True, broken), tokens, True, keep)
    assert calls == 1 and _cosine(got, expected) < FLOOR[dtype]


def test_a_repeat_only_under_a_condition_of_its_own_is_declined_with_the_remedy():
    # `keep[:, None, None, :].float()` in both arms of an `if` inside the mask: binding it ahead would compute
    # it where the original does not choose to, and repeating it is what the branch must not write
    text = PADDED.replace(
        "            bias = keep[:, None, None, :].to(q.dtype)\n",
        "            bias = keep[:, None, None, :].float() if self.heads > 1 else 1.0 - keep[:, None, None, :].float()\n",
    )
    out, findings = _migrate(text)
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed
    assert "repeats a computation evaluated only under a condition of its own" in findings[0].message
    assert findings[0].message.endswith("; to fuse it, bind the bias to a name before the attention")
