"""NPU703's pre-screen (`transforms/fused/rotary_screen.py`) may only skip functions the evaluator would
report nothing for: with it switched off, every rotary fixture (and every fused fixture) comes out the
same, findings included. It must also skip the functions that are plainly no rotary embedding."""

from __future__ import annotations

import ast
from unittest import mock

import pytest
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.transforms.fused import rotary, rotary_screen, rotary_sites, rotary_tail
from npu_migrate.transforms.fused.symbolic import Function

CASES = sorted(
    path
    for rule in ("NPU701", "NPU702", "NPU703", "NPU704", "NPU706")
    for path in (FIXTURES / "rules" / rule).glob("*.in.py")
)


def _run(source: str, path: str):
    migrated, findings = migrate_text(source, path=path)
    return migrated, [(f.line, f.col, f.rule_id, f.message, f.fixed) for f in findings]


def test_the_screen_knows_the_joins_sites_runs_on():
    assert rotary_screen.JOINS == frozenset(rotary_sites._JOINS)


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_switching_the_screen_off_changes_nothing(path):
    source = path.read_text(encoding="utf-8")
    screened = _run(source, path.name)
    with (
        mock.patch.object(rotary, "may_rotate", lambda fn: True),
        mock.patch.object(rotary_tail, "may_hold_site", lambda fn: True),
        mock.patch.object(rotary_screen.Runs, "cannot_run", lambda self, node, x: False),
        mock.patch.object(rotary_sites, "may_be_rotation", lambda expr, fn: True),
    ):
        assert _run(source, path.name) == screened


def test_the_fixtures_hold_rotary_embeddings_the_screen_lets_through():
    # Not vacuous: the fixtures above have sites (rewrites) and declines (findings) of NPU703.
    rotary_findings = [f for p in CASES if "NPU703" in str(p) for f in _run(p.read_text(), p.name)[1]]
    assert any(f[4] for f in rotary_findings if f[2] == "NPU703")
    assert any(not f[4] for f in rotary_findings if f[2] == "NPU703")


def _function(source: str) -> Function:
    tree = ast.parse(source)
    functions = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    return Function(tree.body[-1], False, lambda node: None, {}, functions)


@pytest.mark.parametrize(
    "source",
    [
        "def forward(x, dropout, proj):\n    return dropout(proj(x))\n",
        "def scale(x, s):\n    return x * s\n",  # a product, nothing joined
        "def shift(x, b):\n    return x + b\n",  # a sum, nothing negated or multiplied
        "def cat2(a, b):\n    return torch.cat((a, b), -1)\n",
    ],
)
def test_plainly_no_rotation_is_skipped(source):
    assert not rotary_screen.may_rotate(_function(source))


@pytest.mark.parametrize(
    "source",
    [
        # the product in the caller, the join and the negation in the helper it inlines
        "def rotate_half(x):\n    x1, x2 = x.chunk(2, -1)\n    return torch.cat((-x2, x1), -1)\n"
        "def apply(q, cos, sin):\n    return q * cos + rotate_half(q) * sin\n",
        # an imported rotate_half: the finding that says so needs the product and the call
        "def apply(q, cos, sin):\n    return q * cos + rotate_half(q) * sin\n",
        # complex numbers
        "def apply(x, f):\n    return torch.view_as_real(torch.view_as_complex(x) * f).flatten(3)\n",
        # a rotation alone (no product), in a function with control flow
        "def rot(x):\n    if x is None:\n        return x\n    return torch.cat((-x[..., 1:], x[..., :1]), -1)\n",
    ],
)
def test_rotations_pass(source):
    assert rotary_screen.may_rotate(_function(source))


#: Multi-file packages of test_rotary_imports (and review r5's): the file migrated, and its siblings.
_NESTED = """
import torch


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _mix(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def apply_rope(q, k, cos, sin):
    return _mix(q, cos, sin), _mix(k, cos, sin)
"""
_ATTEND = """
import torch

from .rope import apply_rope


def attend(q, k, cos, sin):
    q, k = apply_rope(q, k, cos, sin)
    return q, k
"""


def _packages():
    from test_rotary_imports import HALF, IDENTITY, PAIR, ROPE

    return {
        "half": {"rope.py": ROPE, "model.py": HALF},
        "pair": {"rope.py": ROPE, "model.py": PAIR},
        # the helper imported calls a helper of its own module, which calls another (review r5)
        "nested": {"rope.py": _NESTED, "model.py": _ATTEND},
        "no-rotation": {"rope.py": ROPE.replace("(-x2, x1)", "(x2, x1)"), "model.py": HALF},
        "starred": {"rope.py": ROPE, "other.py": IDENTITY, "model.py": HALF + "\nfrom .other import *\n"},
        "package-first": {"rope.py": ROPE, "rope/__init__.py": IDENTITY, "model.py": HALF},
        **_reached(),
    }


def _reached():
    """test_rotary_reach's: `rope.rotate_half(x)`, imports in the body, a third module, and declines."""
    from test_rotary_imports import IDENTITY, ROPE
    from test_rotary_reach import ATTRIBUTE, LAYERS, LOCAL, LOCAL_MODULE, THIRD

    starred = LAYERS.replace("rotate_half\n", "rotate_half\nfrom .other import *\n", 1)
    return {
        "reach-attribute": {"rope.py": ROPE, "model.py": ATTRIBUTE},
        "reach-local": {"rope.py": ROPE, "model.py": LOCAL},
        "reach-local-module": {"rope.py": ROPE, "model.py": LOCAL_MODULE},
        "reach-third": {"rope.py": ROPE, "layers.py": LAYERS, "model.py": THIRD},
        "reach-third-starred": {"rope.py": ROPE, "other.py": IDENTITY, "layers.py": starred, "model.py": THIRD},
        "reach-init-binds": {"__init__.py": "rope = None\n", "rope.py": ROPE, "model.py": ATTRIBUTE},
    }


@pytest.mark.parametrize("name", sorted(_packages()))
def test_switching_the_screen_off_changes_nothing_across_sibling_modules(tmp_path, name):
    from test_rotary_imports import _package

    model = _package(tmp_path, _packages()[name]) / "model.py"
    source = model.read_text(encoding="utf-8")
    screened = _run(source, str(model))
    with (
        mock.patch.object(rotary, "may_rotate", lambda fn: True),
        mock.patch.object(rotary_tail, "may_hold_site", lambda fn: True),
        mock.patch.object(rotary_screen.Runs, "cannot_run", lambda self, node, x: False),
        mock.patch.object(rotary_sites, "may_be_rotation", lambda expr, fn: True),
    ):
        assert _run(source, str(model)) == screened
    if name == "nested":  # not vacuous: both tensors fused at the call of the imported helper
        assert screened[0].split("def attend(", 1)[1].count("_npu_rotary_mul(") == 2, screened[0]
    if name in ("reach-attribute", "reach-local", "reach-local-module", "reach-third"):  # not vacuous: fused
        assert "_npu_rotary_mul(" in screened[0].split("def apply(", 1)[1], screened[0]
    if name in ("reach-third-starred", "reach-init-binds"):  # not vacuous: declined
        assert any("not fused" in str(f) for f in screened[1]), screened[1]


def test_a_file_s_statements_leave_the_caches_when_the_next_file_is_checked():
    # The statement caches are keyed by `ast` nodes: a key keeps its file's tree alive, so without a reset
    # each process held thousands of earlier files' statements (transformers: +90 MB peak, #26).
    import sys

    from npu_migrate.engine.pipeline import migrate_text
    from npu_migrate.transforms.fused import symbolic

    earlier = ast.parse("a = b + c\n").body[0]
    symbolic._bound_names(earlier)
    held = sys.getrefcount(earlier)
    migrate_text("import torch\n\n\ndef rms(x, w):\n    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * w\n")
    assert sys.getrefcount(earlier) < held


def _runs(expression: str, x: str):
    from npu_migrate.transforms.fused.evaluator import Structure

    node = ast.parse(expression, mode="eval").body
    target = next(n for n in ast.walk(node) if ast.unparse(n) == x)
    resolve = {"torch": "torch"}

    def qualname(n):
        if isinstance(n, ast.Attribute):
            base = qualname(n.value)
            return f"{base}.{n.attr}" if base else None
        return resolve.get(n.id) if isinstance(n, ast.Name) else None

    structure = Structure()
    return rotary_screen.Runs(qualname, structure).cannot_run(node, target), node, target, qualname, structure


@pytest.mark.parametrize(
    ("expression", "fails"),
    [
        ("self.proj(q) * cos + q * sin", True),  # a call the evaluator does not model, on the way to q
        ("q * cos + helper(q) * sin", True),
        ("q * cos + q.frobnicate() * sin", True),  # a tensor method it does not know
        ("(q if flag else k) * cos", True),  # a node it has no method for, reading q
        ("q * cos + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * sin", False),  # run: a fixed-width rotation
        ("q * self.table(k) + q * sin", False),  # the unknown call does not read q: a table
        ("q * cos.view(q.shape[0], -1) + q * sin", False),  # a table shaped from q's sizes
    ],
)
def test_runs_that_must_fail_are_known_and_agree_with_the_evaluator(expression, fails):
    from npu_migrate.transforms.fused.rotation import meaning, pure_rotation

    found, node, x, qualname, structure = _runs(expression, "q")
    assert found is fails
    if fails:  # the claim `sites` relies on: neither evaluator entry answers anything for it
        assert meaning(node, x, qualname, structure) is None
        assert pure_rotation(node, x, qualname, structure) is None


def test_a_rotary_embedding_is_still_found_through_the_run_screen():
    from npu_migrate.transforms.fused.rotation import meaning

    half = "q.shape[-1] // 2"
    found, node, x, qualname, structure = _runs(
        f"q * cos + torch.cat((-q[..., {half}:], q[..., :{half}]), dim=-1) * sin", "q"
    )
    assert not found
    assert meaning(node, x, qualname, structure).mode == "half"


def test_a_call_is_tested_as_a_rotation_only_when_it_joins_and_negates():
    fn = _function("def rot(x):\n    return torch.cat((-x[..., 4:], x[..., :4]), -1)\n")
    assert rotary_screen.may_be_rotation(fn.tree.body[-1].value, fn)
    for plain in ("torch.cat((x, y), -1)", "-x", "x.view(2, -1)", "self.proj(x) * 2"):
        assert not rotary_screen.may_be_rotation(ast.parse(plain, mode="eval").body, fn), plain
