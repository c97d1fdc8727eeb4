"""A local binding hides a module's import only in the scope that binds it (`Names.scoped`).

diffusers 0.42.1's transformer_z_image.py unpacks `F, H, W = size[i]` in one method beside `import
torch.nn.functional as F`; the file-wide rule made `F.silu` unresolvable everywhere, and NPU702 silent on
`FeedForward._forward_silu_gating`. Each case names the line of a `F.silu` and what it must resolve to.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.program.names import Names

SILU = "torch.nn.functional.silu"
HEAD = "import torch.nn.functional as F\n"
#: A statement binding of `F` elsewhere: what makes the file-wide table distrust `F` (a comprehension's or a
#: lambda's binding alone does not; neither resolver counts those, and they agree on that).
UNPACK = "\n\ndef z(size):\n    F, H, W = size\n"

CASES = {
    # resolved now (None before): the binding is another scope's
    "other function unpacks F": (
        "def a(size):\n    F, H, W = size\n    return F\n\ndef b(x):\n    return F.silu(x)  # here\n",
        SILU,
    ),
    "a parameter named F elsewhere": ("def a(F):\n    return F\n\ndef b(x):\n    return F.silu(x)  # here\n", SILU),
    "class body binds F, method reads it": (
        "class C:\n    F = 1\n\n    def m(self, x):\n        return F.silu(x)  # here\n",
        SILU,
    ),
    "comprehension variable F": ("def a(xs):\n    g = [F for F in xs]\n    return F.silu(g)  # here\n" + UNPACK, SILU),
    "lambda parameter F": ("k = lambda F: F\n\ndef b(x):\n    return F.silu(x)  # here\n" + UNPACK, SILU),
    "nonlocal F in an inner function of another": (
        "def a():\n    F = 1\n\n    def g():\n        nonlocal F\n        F = 2\n\ndef b(x):\n    return F.silu(x)  # here\n",
        SILU,
    ),
    # still None: the binding holds where the name is used
    "same function unpacks F": ("def a(size, x):\n    F, H, W = size\n    return F.silu(x)  # here\n", None),
    "same function binds F after the use": ("def a(x):\n    y = F.silu(x)  # here\n    F = 1\n    return y\n", None),
    "closure of a function that binds F": (
        "def a(x):\n    def inner():\n        return F.silu(x)  # here\n\n    F = 3\n    return inner\n",
        None,
    ),
    "class body reads its own F": ("class C:\n    F = 1\n    act = F.silu  # here\n", None),
    "inside the comprehension that binds F": (
        "def a(xs):\n    return [F.silu(F) for F in xs]  # here\n" + UNPACK,
        None,
    ),
    "inside the lambda that binds F": ("k = lambda F: F.silu(F)  # here\n" + UNPACK, None),
    "global F rebinds the module's": (
        "def a():\n    global F\n    F = 1\n\ndef b(x):\n    return F.silu(x)  # here\n",
        None,
    ),
    "rebound at module level": ("F = None\n\ndef b(x):\n    return F.silu(x)  # here\n", None),
    "imported only in a function": (
        "def a():\n    import torch.nn.functional as F\n\ndef b(F):\n    return F.silu(x)  # here\n",
        None,
    ),
}


def _resolve_marked(source: str) -> str | None:
    tree = ast.parse(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if text.endswith("# here"))
    names = Names.of(tree)
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "silu" and n.lineno == line]
    assert len(found) == 1
    return names.resolve(found[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_local_binding_hides_the_import_only_in_its_scope(case):
    body, expected = CASES[case]
    source = (HEAD if "imported only" not in case else "") + body
    assert _resolve_marked(source) == expected


def test_a_node_without_a_position_stays_unresolved():
    """Built by a rule (no `lineno`): where it was written is unknown, so a locally shadowed root is not trusted."""
    source = HEAD + "def a(size):\n    F, H, W = size\n"
    names = Names.of(ast.parse(source))
    assert names.resolve(ast.Attribute(ast.Name("F", ast.Load()), "silu", ast.Load())) is None
    # the file-wide tables stay as the libcst resolver has them
    assert "F" in names.shadowed and "F" not in names.bindings


def test_swiglu_is_fused_beside_a_method_that_unpacks_F():
    """The z_image shape: NPU702 fuses `F.silu(x1) * x3` though another method binds `F` locally."""
    text = textwrap.dedent(
        """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class FeedForward(nn.Module):
            def _forward_silu_gating(self, x1, x3):
                return F.silu(x1) * x3


        def patchify(size):
            F, H, W = size
            return F * H * W
        """
    )
    out, findings = migrate_text(text, path="ff.py", select=["NPU702"])
    assert "npu_swiglu" in out and "if _is_npu(x1)" in out, [f.message for f in findings]
    # the method that binds `F` is left as it was
    assert out.endswith("def patchify(size):\n    F, H, W = size\n    return F * H * W\n")
