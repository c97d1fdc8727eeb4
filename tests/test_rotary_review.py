"""Review defects in NPU703's branch: a user call run twice on an NPU, a misleading decline, scalar tables.

The migrated code is executed with `_is_npu` forced true and verify's CPU reference kernels as `torch_npu`,
as in test_rotary_meaning.py.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch

TORCH_NPU = reference.torch_npu_module()

SOURCE = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F


    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)


    def apply(q, cos, sin):
        return q * cos + rotate_half(q) * sin


    class Rope(torch.nn.Module):
        def __init__(self, bn):
            super().__init__()
            self.bn = bn

        def forward(self, x, cos, sin):
            x = self.bn(x)
            return x * cos + rotate_half(x) * sin


    class RopeTables(torch.nn.Module):
        def __init__(self, bn):
            super().__init__()
            self.bn = bn

        def forward(self, x, cos, sin):
            x = self.bn(x)
            cos = cos.unsqueeze(2)
            sin = sin.unsqueeze(2)
            return x * cos + rotate_half(x) * sin


    class RopeInline(torch.nn.Module):
        def forward(self, x, cos, sin):
            return self.bn(x) * cos + rotate_half(self.bn(x)) * sin


    def relu_inline(x, cos, sin):
        return torch.relu(x) * cos + rotate_half(torch.relu(x)) * sin


    def relu_statement(x, cos, sin):
        x = torch.relu(x)
        return x * cos + rotate_half(x) * sin


    def rms_inline(x, cos, sin):
        return F.rms_norm(x, (x.shape[-1],)) * cos + rotate_half(F.rms_norm(x, (x.shape[-1],))) * sin
    """
)


class _Counting(torch.nn.Module):
    """Stands for BatchNorm / dropout: what it returns depends on how often it ran."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


def _namespace(text: str, *, fits=None) -> dict:
    namespace = {"__name__": "rope"}
    exec(compile(text, "rope.py", "exec"), namespace)
    namespace["_is_npu"] = lambda x: True
    namespace["torch_npu"] = TORCH_NPU
    if fits is not None:
        namespace["_npu_rotary_fits"] = lambda *args, **kwargs: fits
    return namespace


def _tables():
    angles = torch.rand(1, 5, 1, 16) * 6
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("fits", [False, True])
@pytest.mark.parametrize("name", ["Rope", "RopeTables"])
def test_a_module_call_before_the_rotation_runs_once_on_an_npu(name, fits):
    text, _ = migrate_text(SOURCE, path="rope.py", select=["NPU703"])
    method = text.split(f"class {name}(")[1].split("\nclass ")[0]
    assert "_npu_rotary_mul(" in method, "the rotation after the call is still fused"
    x = torch.randn(2, 5, 3, 16)
    cos, sin = _tables()
    if name == "RopeTables":
        cos, sin = cos[:, :, 0], sin[:, :, 0]
    original = _namespace(SOURCE)[name](_Counting())(x, cos, sin)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    bn = _Counting()
    got = _namespace(text, fits=fits)[name](bn)(x, cos, sin)
    assert bn.calls == 1
    assert TORCH_NPU.calls["npu_rotary_mul"] - before == (1 if fits else 0)
    torch.testing.assert_close(got, original)


def test_a_module_call_inside_the_rotation_is_declined_not_run_twice():
    text, findings = migrate_text(SOURCE, path="rope.py", select=["NPU703"])
    assert "_npu_rotary_mul(" not in text.split("class RopeInline(")[1].split("\ndef ")[0]
    lines = SOURCE.splitlines()
    line = lines.index("    def forward(self, x, cos, sin):", lines.index("class RopeInline(torch.nn.Module):")) + 1
    (message,) = [f.message for f in findings if f.line == line]
    assert "not fused" in message and "`self.bn`" in message and "again" in message


@pytest.mark.parametrize(("name", "computed"), [("relu_inline", "torch.relu(x)"), ("rms_inline", "F.rms_norm(x")])
def test_a_rotated_tensor_computed_by_an_unmodelled_call_is_declined_for_that(name, computed):
    _, findings = migrate_text(SOURCE, path="rope.py", select=["NPU703"])
    line = SOURCE.splitlines().index(f"def {name}(x, cos, sin):") + 1
    (message,) = [f.message for f in findings if f.line == line]
    assert "not fused" in message and computed in message
    assert "not recognised as rotate_half" not in message


def test_python_number_tables_fall_back_to_the_original_on_an_npu():
    text, _ = migrate_text(SOURCE, path="rope.py", select=["NPU703"])
    assert "_npu_rotary_fits(cos, sin, q" in text
    q = torch.randn(2, 5, 3, 16)
    got = _namespace(text)["apply"](q, 0.5, 0.25)
    torch.testing.assert_close(got, _namespace(SOURCE)["apply"](q, 0.5, 0.25))


def test_a_rotated_tensor_computed_by_an_unmodelled_call_in_its_own_statement_is_fused():
    text, _ = migrate_text(SOURCE, path="rope.py", select=["NPU703"])
    assert "_npu_rotary_mul(x, cos, sin" in text.split("def relu_statement(")[1].split("\ndef ")[0]
    x = torch.randn(2, 5, 3, 16)
    cos, sin = _tables()
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text)["relu_statement"](x, cos, sin)
    assert TORCH_NPU.calls["npu_rotary_mul"] - before == 1
    torch.testing.assert_close(got, _namespace(SOURCE)["relu_statement"](x, cos, sin))


def test_a_complex_table_built_in_a_cached_branch_is_no_rotary_embedding():
    # audiocraft's `get_decay`: `torch.polar` under `if self.decay is None ...` builds a table and rotates
    # nothing; it was reported as a "rotary embedding under `if ...` left alone" (a finding that is not true).
    source = textwrap.dedent(
        """
        import torch


        class Decay:
            def get_decay(self, start, end):
                if self.decay is None or end > self.decay.shape[0]:
                    scale = self.rates ** torch.arange(end).unsqueeze(-1)
                    self.decay = torch.polar(scale, torch.zeros_like(scale))
                return self.decay[start:end]


        def rotate(x, freqs, use_real=True):
            if use_real:
                return x * freqs
            return torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * freqs).flatten(-2)
        """
    )
    _, findings = migrate_text(source, path="decay.py", select=["NPU703"])
    messages = [f.message for f in findings]
    assert not [m for m in messages if "self.decay is None" in m], messages
    # a flag choosing the side that views x as complex numbers still gets its branch
    assert [f for f in findings if f.line == 13 and f.fixed], messages
