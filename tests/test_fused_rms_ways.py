"""NPU701 per way through `if`s: which tests a branch in front of the body may evaluate again (torch-free).

A test on the module's own configuration is repeated by the branch only where it gives the same answer
with no side effect (`ways.attribute_problem`): an attribute the class binds in `__init__` alone, to plain
data, with no property, method or class attribute of that name in the class, its bases or subclasses of
the file, and of a tensor attribute only its dtype / shape / ndim. Everything else is left alone, and the
finding says why. The numbers of the ways that fuse are in test_fused_rms_paths.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text

RULE_DIR = FIXTURES / "rules" / "NPU701"


def _migrate(text: str):
    text = textwrap.dedent(text).lstrip()
    out, findings = migrate_text(text, path="norm.py", select=["NPU701"])
    return text, out, [f for f in findings if not f.message.startswith("fused-op helpers")]


@pytest.mark.parametrize(
    ("fixture", "why"),
    [
        ("flag_property", "`PropertyNorm` defines `upcast` as a method or property"),
        ("flag_reassigned", "`self.upcast` is bound outside `__init__` (line 14)"),
        ("test_calls", "its test calls `torch.is_autocast_enabled`"),
        ("flag_inherited", "`self.fp32` is not bound in this class's `__init__`"),
    ],
)
def test_a_test_the_branch_cannot_repeat_is_left_alone_and_said(fixture, why):
    text, out, findings = _migrate((RULE_DIR / f"{fixture}.in.py").read_text())
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed
    assert why in findings[0].message and "a branch in front cannot repeat its `if`'s test" in findings[0].message


FLAG_NORM = """
    import torch
    from torch import nn


    class FlagNorm(nn.Module):
        def __init__(self, width, eps=1e-6, upcast=True):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))
            self.eps = eps
            self.upcast = upcast

        def forward(self, x):
            dtype = x.dtype
            if self.upcast:
                x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x.to(dtype)
    """


def test_a_plain_flag_fuses_both_ways():
    text, out, findings = _migrate(FLAG_NORM)
    assert len(findings) == 1 and findings[0].fixed and "(2 of 2 ways)" in findings[0].message
    assert out.count("return _npu_rms_norm(") == 2
    assert "            if self.upcast:\n" in out and "            if not self.upcast:\n" in out


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # a subclass in the file that makes the flag a property
        (
            ("", "\n\nclass Sub(FlagNorm):\n    @property\n    def upcast(self):\n        return True\n"),
            "`Sub` defines `upcast` as a method or property",
        ),
        # a base class in the file with a class attribute of that name
        (
            ("class FlagNorm(nn.Module):", "class Base(nn.Module):\n    upcast = True\n\n\nclass FlagNorm(Base):"),
            "`Base` has",
        ),
        # another method that flips it
        (
            (
                "    def forward(self, x):",
                "    def flip(self):\n        self.upcast = not self.upcast\n\n    def forward(self, x):",
            ),
            "`self.upcast` is bound outside `__init__`",
        ),
        # bound to something computed: its truth may be computed too
        (("self.upcast = upcast", "self.upcast = make_flag(upcast)"), "holds a computed object"),
        # set by name
        (("self.upcast = upcast", "setattr(self, 'upcast', upcast)"), "is not bound in this class's `__init__`"),
    ],
    ids=["subclass-property", "base-class-attribute", "flipped-by-a-method", "computed", "setattr"],
)
def test_a_flag_that_may_read_otherwise_is_left_alone(change, why):
    old, new = change
    source = textwrap.dedent(FLAG_NORM).lstrip()
    source = source + new if old == "" else source.replace(old, new)
    assert source != textwrap.dedent(FLAG_NORM).lstrip()
    text, out, findings = _migrate(source)
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed
    assert why in findings[0].message, findings[0].message


def test_a_tensor_read_needs_an_attribute_that_is_always_a_tensor():
    # `self.scale.dtype` where `scale` may be a float: `.dtype` is not a tensor's metadata there
    source = (
        textwrap.dedent(FLAG_NORM)
        .lstrip()
        .replace("self.upcast = upcast", "self.scale = 1.0 if upcast else torch.ones(width)")
        .replace("if self.upcast:", "if self.scale.dtype == torch.float32:")
    )
    text, out, findings = _migrate(source)
    assert out == text and not findings[0].fixed
    assert "`self.scale` is not always a tensor" in findings[0].message


def test_a_registered_buffer_reads_its_dtype():
    source = (
        textwrap.dedent(FLAG_NORM)
        .lstrip()
        .replace("self.upcast = upcast", 'self.register_buffer("ref", torch.zeros(1))')
        .replace("if self.upcast:", "if self.ref.dtype != torch.float32:")
    )
    text, out, findings = _migrate(source)
    assert findings[0].fixed, findings[0].message
    assert "self.ref.dtype != torch.float32" in out and "self.ref.dtype == torch.float32" in out
