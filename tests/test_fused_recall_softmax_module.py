"""Issue #23: hand-written attention whose softmax is an `nn.Softmax(dim=-1)` module (`self.attend(dots)`,
the shape of 48 files of vit-pytorch, and of timm's, mmpretrain's and megatron-core's) was silent; NPU704
now reads the module's dim from `__init__` and fuses it.

The module below is our own, written for this test. The migrated code runs with `_is_npu` forced true and
the CPU reference kernels (`npu_migrate.verify.reference`) as `torch_npu`: in bf16 / fp16 the kernel is
called once and agrees with the original; in fp32 the kernel does not run and the output is bit-identical;
a branch with the wrong scale is caught; an `nn.Softmax` over another dim, or without one, is declined.
"""

from __future__ import annotations

import importlib
import textwrap

import pytest
import torch

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # torch: the `integration` extra

TORCH_NPU = reference.torch_npu_module()
FLOOR = {torch.float32: 0.999, torch.bfloat16: 0.99, torch.float16: 0.99}

SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class HeadsMixer(nn.Module):
        def __init__(self, width, heads, p=0.0):
            super().__init__()
            self.heads = heads
            self.temperature = (width // heads) ** -0.5
            self.normalise = nn.Softmax(dim=SOFTMAX_DIM)
            self.drop = nn.Dropout(p)
            self.qkv = nn.Linear(width, 3 * width, bias=False)
            self.out = nn.Linear(width, width)

        def forward(self, tokens):
            b, n, c = tokens.shape[0], tokens.shape[1], tokens.shape[2]
            qkv = self.qkv(tokens).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            affinity = torch.matmul(q, k.transpose(-1, -2)) * self.temperature
            weights = self.normalise(affinity)
            weights = self.drop(weights)
            mixed = torch.matmul(weights, v)
            return self.out(mixed.transpose(1, 2).reshape(b, n, c))
    """
).lstrip()


def _migrate(dim: str = "-1", attribute: str = "normalise"):
    text = SOURCE.replace("SOFTMAX_DIM", dim).replace("self.normalise", f"self.{attribute}")
    out, findings = migrate_text(text, path="mixer.py", select=["NPU704"])
    # the helpers' finding (added once per file) is about the file, not the site
    return text, out, [f for f in findings if f.rule_id == "NPU704" and not f.message.startswith("fused-op helpers")]


def _module(text: str, dtype, *, forced: bool, mutate=None):
    if mutate is not None:
        assert mutate[0] in text, mutate
        text = text.replace(*mutate)
    namespace = {"__name__": "mixer"}
    exec(compile(text, "mixer.py", "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    torch.manual_seed(0)
    return namespace["HeadsMixer"](64, 4).to(dtype).eval()


def _tokens(dtype):
    return torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(3)).to(dtype)


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def test_an_nn_softmax_module_over_the_last_dim_is_fused_once_and_idempotent():
    text, out, findings = _migrate()
    assert len(findings) == 1 and findings[0].fixed, [f.message for f in findings]
    assert "_npu_eager_attention(" in out and "self.temperature" in out.split("_npu_eager_attention(")[-1][:200]
    assert migrate_text(out, path="mixer.py", select=["NPU704"])[0] == out


@pytest.mark.parametrize("dtype", list(FLOOR), ids=str)
def test_the_branch_agrees_and_the_fallback_is_bit_identical(dtype):
    text, out, _ = _migrate()
    with torch.no_grad():
        expected = _module(text, dtype, forced=False)(_tokens(dtype))
        before = TORCH_NPU.calls["npu_fusion_attention"]
        got = _module(out, dtype, forced=True)(_tokens(dtype))
        calls = TORCH_NPU.calls["npu_fusion_attention"] - before
        assert got.dtype == expected.dtype and _cosine(got, expected) >= FLOOR[dtype]
        if dtype == torch.float32:
            # the kernel takes fp16 / bf16 only: the original code runs, bit for bit
            assert calls == 0 and torch.equal(got, expected)
        else:
            assert calls == 1
        # off the NPU the migrated file is the original
        assert torch.equal(_module(out, dtype, forced=False)(_tokens(dtype)), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_branch_that_drops_the_scale_is_caught(dtype):
    text, out, _ = _migrate()
    call = out.split("_npu_eager_attention(")[-1]
    args = call[: call.index(")\n")]
    broken = ("_npu_eager_attention(" + args, "_npu_eager_attention(" + args.replace("self.temperature", "1.0"))
    with torch.no_grad():
        expected = _module(text, dtype, forced=False)(_tokens(dtype))
        got = _module(out, dtype, forced=True, mutate=broken)(_tokens(dtype))
    assert _cosine(got, expected) < FLOOR[dtype]


@pytest.mark.parametrize("dim", ["1", "None"])
def test_an_nn_softmax_over_another_dim_is_declined(dim):
    # nn.Softmax() without a dim picks one by the input's rank: 1 for 4-D scores, the heads
    text, out, findings = _migrate(dim)
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed
    assert "the softmax is not over the last dim" in findings[0].message, findings[0].message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_module_attribute_named_softmax_is_the_module_not_a_tensor_method(dtype):
    # mmpretrain's and timm's swin: `self.softmax = nn.Softmax(dim=-1)`, then `self.softmax(attn)`, which
    # reads like the method `t.softmax(dim)` of a tensor `self`
    text, out, findings = _migrate(attribute="softmax")
    assert len(findings) == 1 and findings[0].fixed, [f.message for f in findings]
    with torch.no_grad():
        expected = _module(text, dtype, forced=False)(_tokens(dtype))
        got = _module(out, dtype, forced=True)(_tokens(dtype))
    assert _cosine(got, expected) >= FLOOR[dtype]


def test_the_migrated_module_still_scripts_and_traces(tmp_path, monkeypatch):
    # TorchScript compiles the branch (the helper is `@torch.jit.unused`), FX traces past it (`_is_npu` is
    # False for a Proxy): both keep the original's output. TorchScript reads the source from a file.
    text, out, _ = _migrate()
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = {}
    for name, code in (("mixer_in", text), ("mixer_out", out)):
        (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
        modules[name] = importlib.import_module(name)
    torch.manual_seed(0)
    original = modules["mixer_in"].HeadsMixer(64, 4).eval()
    torch.manual_seed(0)
    migrated = modules["mixer_out"].HeadsMixer(64, 4).eval()
    tokens = _tokens(torch.float32)
    with torch.no_grad():
        expected = original(tokens)
        assert torch.equal(torch.jit.script(migrated)(tokens), expected)
        assert torch.equal(torch.fx.symbolic_trace(migrated)(tokens), expected)


_INIT_LINE = "        self.normalise = nn.Softmax(dim=-1)\n"
_FORWARD = "\n    def forward(self, tokens):"
# Each rebinds `self.normalise` where the `__init__` assignment does not show it: the module the forward
# calls may be an `nn.Sigmoid`, and a fused branch would compute a softmax there instead (reviewer, #23).
REBINDINGS = {
    "another_method": (_FORWARD, "\n    def use_sigmoid(self):\n        self.normalise = nn.Sigmoid()\n" + _FORWARD),
    "annotated_in_if": (
        _INIT_LINE,
        _INIT_LINE + "        if p > 0.5:\n            self.normalise: nn.Module = nn.Sigmoid()\n",
    ),
    "subclass_init": (
        None,
        "\n\nclass Sig(HeadsMixer):\n    def __init__(self, width, heads, p=0.0):\n"
        "        super().__init__(width, heads, p)\n        self.normalise = nn.Sigmoid()\n",
    ),
    "only_under_if": (_INIT_LINE, "        if heads:\n" + "    " + _INIT_LINE),
    "setattr": (
        _FORWARD,
        "\n    def use_sigmoid(self):\n        setattr(self, 'normalise', nn.Sigmoid())\n" + _FORWARD,
    ),
    "add_module": (_INIT_LINE, _INIT_LINE + "        self.add_module('normalise', nn.Sigmoid())\n"),
    "del": (_FORWARD, "\n    def drop_it(self):\n        del self.normalise\n" + _FORWARD),
}


@pytest.mark.parametrize("case", list(REBINDINGS))
def test_an_nn_softmax_attribute_bound_again_is_declined(case):
    old, new = REBINDINGS[case]
    text = _migrate()[0]
    text = text + new if old is None else text.replace(old, new, 1)
    assert text != _migrate()[0]
    out, findings = migrate_text(text, path="mixer.py", select=["NPU704"])
    findings = [f for f in findings if f.rule_id == "NPU704" and not f.message.startswith("fused-op helpers")]
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed, [f.message for f in findings]
    message = findings[0].message
    assert "may not be the `nn.Softmax`" in message and "torch.softmax(..., dim=-1)" in message, message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_softmax_rebound_to_sigmoid_differs_from_the_fused_softmax(dtype):
    # Why the declines above matter: the reviewer's subclass, run through the branch the plain class gets
    # (the fix's old output), is caught by the same floor the fused tests use.
    _, out, _ = _migrate()
    sub = REBINDINGS["subclass_init"][1]
    with torch.no_grad():
        results = []
        for code, forced in ((_migrate()[0] + sub, False), (out + sub, True)):
            namespace = {"__name__": "mixer"}
            exec(compile(code, "mixer.py", "exec"), namespace)
            if forced:
                namespace["_is_npu"] = lambda x: True
                namespace["torch_npu"] = TORCH_NPU
            torch.manual_seed(0)
            results.append(namespace["Sig"](64, 4).to(dtype).eval()(_tokens(dtype)))
    assert _cosine(results[1], results[0]) < FLOOR[dtype]


@pytest.mark.parametrize("case", ["method", "subclass"])
def test_an_nn_dropout_attribute_bound_again_is_declined(case):
    # the branch reads `self.drop.p`: an `nn.Identity` bound to it would make the branch raise in training
    text = _migrate()[0]
    if case == "method":
        text = text.replace(_FORWARD, "\n    def no_drop(self):\n        self.drop = nn.Identity()\n" + _FORWARD, 1)
    else:
        text += "\n\nclass Plain(HeadsMixer):\n    def __init__(self, width, heads):\n"
        text += "        super().__init__(width, heads)\n        self.drop = nn.Identity()\n"
    out, findings = migrate_text(text, path="mixer.py", select=["NPU704"])
    findings = [f for f in findings if f.rule_id == "NPU704" and not f.message.startswith("fused-op helpers")]
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed, [f.message for f in findings]
    assert "may not be the `nn.Dropout`" in findings[0].message, findings[0].message
