"""Issue #23 (reviewer's standard: injected code has no repeated sub-expressions): NPU703's branch where a
window of the head rotates binds the rotated width once (`_npu_w`) and each window the check and the kernel
both read (`_npu_x*`), wherever the width comes from: the table's shape (Phi-3's `cos.shape[-1]`, Qwen's
`freqs[0].shape[-1]`), the tensor's (torchtitan's `rope_cache[..., :query.shape[-1]]`, whose table windows
are bound as `_npu_cos` / `_npu_sin`), an offset plus a size, or a table read as ChatGLM's
(`rotary_window`, which test_rotary_window checks). The numbers of these fixtures are checked where they
were (test_fused_ops, test_fused_spellings, test_fused_third_party, test_rotary_imports).
"""

from __future__ import annotations

import ast
from collections import Counter

import pytest
from conftest import FIXTURES

NPU703 = FIXTURES / "rules" / "NPU703"

#: (fixture, function): the four whose branches wrote the width again and again, and ChatGLM's.
BRANCHES = [
    ("partial_rotary", "apply_rotary_pos_emb"),
    ("static_helper", "apply_rotary_emb"),
    ("einops_interleaved", "rotate_scaled"),
    ("einops_interleaved", "rotate_window"),
    ("qwen_partial_rotary", "apply_rotary_pos_emb"),
    ("width_from_table", "rotate_table_width"),
    # q and k rotated by one helper (test_rotary_qk_helper runs their numbers)
    ("qk_window_helper", "_rot"),
    ("qk_window_helper", "apply_rotary_pos_emb"),
    ("qk_window_helper", "apply_rotary_cached"),
]


def _branch(text: str, function: str) -> ast.If:
    """The `if _is_npu(...)` branch NPU703 put first in `function` (a method too)."""
    fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function)
    branch = next(s for s in fn.body if isinstance(s, ast.If))
    assert ast.unparse(branch.test).startswith("_is_npu("), ast.unparse(branch)
    return branch


def repeated(branch: ast.If) -> dict[str, int]:
    """What the branch's body computes more than once: subscripts, size reads, arithmetic and calls (the
    kernel and its check differ by the tensor they rotate). Not counted: an entry of a name (`freqs[0]`, a
    table passed in as a pair), which reads what is there as a name does, and arithmetic of a name and a
    number (`_npu_w // 2` in q's and k's views), which a name for it would not make shorter. The guard is
    left out: it checks a width read from elsewhere before the body binds it (`0 <= cache.shape[-2] * 2 <=
    x.shape[-1]`)."""

    def counted(node: ast.AST) -> bool:
        if isinstance(node, ast.Subscript):
            return not (isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant))
        if isinstance(node, ast.BinOp):
            return {type(node.left), type(node.right)} != {ast.Name, ast.Constant}
        return isinstance(node, ast.Call) or isinstance(node, ast.Attribute) and node.attr == "shape"

    counts = Counter(ast.unparse(node) for stmt in branch.body for node in ast.walk(stmt) if counted(node))
    return {text: count for text, count in counts.items() if count > 1}


@pytest.mark.parametrize("case, function", BRANCHES, ids=[f"{c}-{f}" for c, f in BRANCHES])
def test_the_width_and_its_windows_are_written_once(case, function):
    branch = _branch((NPU703 / f"{case}.out.py").read_text(), function)
    code = ast.unparse(branch)
    assert not repeated(branch), (repeated(branch), code)
    # the width is bound once and read from that name: no size read of it is left in the kernel's arguments
    bound = [s for s in ast.walk(branch) if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "_npu_w"]
    assert len(bound) == 1, code
    kernel = [n for n in ast.walk(branch) if isinstance(n, ast.Call) and ast.unparse(n.func) == "_npu_rotary_mul"]
    assert kernel and not any(".shape" in ast.unparse(call) for call in kernel), code


def test_tables_of_their_own_for_q_and_k_are_built_once_each():
    """The helper cuts the cache to each tensor's length (q's and k's tables differ) or xpos scales them
    differently: what both tables of a tensor read (the cut view, `freqs.cos()`, `scale ** -1`) is bound
    once, as where one function spells it once."""
    text = (NPU703 / "qk_window_helper.out.py").read_text()
    for function in ("apply_rotary_cached", "apply_xpos"):
        branch = _branch(text, function)
        assert not repeated(branch), (repeated(branch), ast.unparse(branch))
        assert "_npu_cos1" in ast.unparse(branch) and "_npu_sin1" in ast.unparse(branch)


def test_the_check_catches_a_branch_that_still_repeats():
    """The check fails on the branch as it was (Phi-3's, before the width was bound)."""
    before = """
if _is_npu(q):
    _npu_cos = cos.unsqueeze(unsqueeze_dim)
    _npu_sin = sin.unsqueeze(unsqueeze_dim)
    if _npu_rotary_fits(_npu_cos, _npu_sin, q[..., :_npu_cos.shape[-1]], mode="half"):
        return torch.cat([_npu_rotary_mul(q[..., :_npu_cos.shape[-1]], _npu_cos, _npu_sin, rotary_mode="half"),
                          q[..., _npu_cos.shape[-1]:]], dim=-1)
"""
    module = ast.parse(
        f"def f(q, cos, sin, unsqueeze_dim):\n{''.join('    ' + line + chr(10) for line in before.strip().splitlines())}"
    )
    found = repeated(module.body[0].body[0])
    assert found["_npu_cos.shape[-1]"] == 3 and found["q[..., :_npu_cos.shape[-1]]"] == 2, found
