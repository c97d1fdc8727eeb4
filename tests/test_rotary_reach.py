"""Issue #23: more of the ways real code reaches its rotary helper, followed by NPU703 (`imported.py`).

* a module of the project, then its function: `from . import rope` / `import pkg.rope as rp`, then
  `rope.rotate_half(x)` or `rp.apply_rotary_pos_emb(q, k, cos, sin)`;
* imports at the top of the function's body (`def apply(...): from .rope import rotate_half`): the branch
  goes after them;
* a sibling helper that calls a name its own module imports from a third module (one level more).

Each is migrated and run (our own code, written here): `_is_npu` forced true with verify's CPU reference
kernels as `torch_npu`, against the original: fp32 cosine >= 0.999, bf16 >= 0.99, the kernel once per
rotated tensor, the fallback bit-identical; a broken rewrite (the sin table negated, the other pairing) is
shown failing. Every file followed is a dependency of the cached result; what may be rebound (a star
import, `global`, a package `__init__.py` binding the name, a `try` import's fallback, a name rebound in
the body) is declined with the reason, never silent.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from pathlib import Path

import pytest
from test_rotary_imports import IDENTITY, ROPE, _cached_run, _fused, _messages, _migrate, _package

from npu_migrate.engine import runner
from npu_migrate.engine.pipeline import Mode, Plan, migrate_text
from npu_migrate.engine.registry import select_rules

ATTRIBUTE = """
import torch

from . import rope


def apply(q, cos, sin):
    return q * cos + rope.rotate_half(q) * sin
"""

MODULE_ALIAS = """
import torch

import PACKAGE.rope as rp


def apply(q, k, cos, sin):
    q, k = rp.apply_rotary_pos_emb(q, k, cos, sin)
    return q, k
"""

LOCAL = '''
import torch


def apply(q, cos, sin):
    """Rotary embedding, its helper imported where it is used."""
    from .rope import rotate_half
    return q * cos + rotate_half(q) * sin
'''

LOCAL_MODULE = """
import torch


def apply(q, cos, sin):
    from . import rope
    return q * cos + rope.rotate_half(q) * sin
"""

#: The third-module case: model.py imports `apply_rope` from layers.py, which imports `rotate_half` from rope.py.
LAYERS = """
import torch

from .rope import rotate_half


def apply_rope(q, cos, sin):
    return q * cos + rotate_half(q) * sin
"""

THIRD = """
import torch

from .layers import apply_rope


def apply(q, cos, sin):
    return apply_rope(q, cos, sin)
"""

#: name -> (model.py, its siblings, whether `apply` rotates q and k)
CASES = {
    "attribute": (ATTRIBUTE, {"rope.py": ROPE}, False),
    "module_alias": (MODULE_ALIAS, {"rope.py": ROPE}, True),
    "local_import": (LOCAL, {"rope.py": ROPE}, False),
    "local_module": (LOCAL_MODULE, {"rope.py": ROPE}, False),
    "third_module": (THIRD, {"rope.py": ROPE, "layers.py": LAYERS}, False),
}

_modules = itertools.count()


def _build(tmp_path: Path, name: str, model: str | None = None) -> Path:
    text, siblings, _ = CASES[name]
    package = _package(tmp_path, {**siblings, "model.py": model or text})
    source = (package / "model.py").read_text(encoding="utf-8").replace("PACKAGE", package.name)
    (package / "model.py").write_text(source, encoding="utf-8")
    return package


def _load(package: Path, text: str):
    """`text` as a module of `package`, under a fresh name (its relative imports resolve in the package)."""
    name = f"m{next(_modules)}"
    (package / f"{name}.py").write_text(text, encoding="utf-8")
    sys.path.insert(0, str(package.parent))
    try:
        return importlib.import_module(f"{package.name}.{name}")
    finally:
        sys.path.remove(str(package.parent))


@pytest.mark.parametrize("name", CASES)
def test_each_way_of_reaching_the_helper_is_fused_at_the_call_site_and_idempotent(tmp_path, name):
    package = _build(tmp_path, name)
    before = {p.name: p.read_text() for p in package.iterdir() if p.is_file()}
    text, findings = _migrate(package / "model.py")
    assert _fused(findings), _messages(findings)
    body = text.split("def apply(", 1)[1]
    assert body.count("_npu_rotary_mul(") == (2 if CASES[name][2] else 1), body
    assert migrate_text(text, path=str(package / "model.py"), select=["NPU703"])[0] == text  # idempotent
    if name.startswith("local"):
        # The branch follows the imports, which run first as in the original.
        imports, branch = (
            body.index("import rope" if name == "local_module" else "import rotate_half"),
            body.index("if _is_npu("),
        )
        assert imports < branch, body
    assert {p.name: p.read_text() for p in package.iterdir() if p.is_file()} == before  # nothing else written


def _tensors(dtype):
    import torch

    generator = torch.Generator().manual_seed(5)
    theta = (torch.rand(1, 1, 6, 4, generator=generator) * 2 - 1) * 3.14159
    theta = torch.cat((theta, theta), dim=-1)  # the half layout: one angle per pair of halves
    q = 3 * torch.randn(2, 3, 6, 8, generator=generator)
    k = 3 * torch.randn(2, 1, 6, 8, generator=generator)
    return q.to(dtype), k.to(dtype), theta.cos().to(dtype), theta.sin().to(dtype)


def _call(module, rotates_k: bool, dtype):
    q, k, cos, sin = _tensors(dtype)
    out = module.apply(q, k, cos[0], sin[0]) if rotates_k else module.apply(q, cos, sin)
    return out if isinstance(out, tuple) else (out,)


def _cosine(a, b) -> float:
    import torch.nn.functional as F

    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


@pytest.mark.integration  # runs the migrated code with torch
@pytest.mark.parametrize("name", CASES)
def test_the_branch_agrees_with_the_original_and_a_broken_one_is_caught(tmp_path, name):
    import torch

    from npu_migrate.verify import reference

    torch_npu = reference.torch_npu_module()
    package = _build(tmp_path, name)
    original = (package / "model.py").read_text(encoding="utf-8")
    text, findings = _migrate(package / "model.py")
    assert _fused(findings), _messages(findings)
    rotates_k = CASES[name][2]
    expected_module = _load(package, original)

    def forced(source: str):
        module = _load(package, source)
        module._is_npu, module.torch_npu = (lambda x: True), torch_npu
        return module

    for dtype, floor in ((torch.float32, 0.999), (torch.bfloat16, 0.99)):
        want = _call(expected_module, rotates_k, dtype)
        before = torch_npu.calls["npu_rotary_mul"]
        got = _call(forced(text), rotates_k, dtype)
        assert torch_npu.calls["npu_rotary_mul"] - before == len(want)  # the kernel once per rotated tensor
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert _cosine(a, b) >= floor, (dtype, _cosine(a, b))
        # With `_is_npu` false the migrated code is the original, bit for bit.
        kept = _call(_load(package, text), rotates_k, dtype)
        assert all(torch.equal(a, b) for a, b in zip(kept, want))

    want = _call(expected_module, rotates_k, torch.float32)
    # Wrong pairing: the same branch in the other rotary_mode.
    assert 'rotary_mode="half"' in text
    paired = _call(forced(text.replace('rotary_mode="half"', 'rotary_mode="interleave"')), rotates_k, torch.float32)
    assert _cosine(paired[0], want[0]) < 0.999
    # Wrong sign: a kernel that rotates the other way round.
    real = torch_npu.npu_rotary_mul
    torch_npu.npu_rotary_mul = lambda x, r1, r2, real=real, **kw: real(x, r1, -r2, **kw)
    try:
        signed = _call(forced(text), rotates_k, torch.float32)
    finally:
        torch_npu.npu_rotary_mul = real
    assert _cosine(signed[0], want[0]) < 0.999


#: Per case, a file the result was computed from, and what an edit to it that stops the rotation writes.
_FOLLOWED = {
    "attribute": ("rope.py", textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)")),
    "module_alias": ("rope.py", textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)")),
    "local_import": ("rope.py", textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)")),
    "local_module": ("rope.py", textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)")),
    # the third module, which model.py does not import
    "third_module": ("rope.py", textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)")),
    # the package's `__init__.py`, read for what it binds to `rope` (it now binds the name itself)
    "attribute-init": ("__init__.py", "rope = None\n"),
    # the middle module of the third-module case
    "third_module-layers": ("layers.py", textwrap.dedent(LAYERS).replace("from .rope import", "from .absent import")),
}


@pytest.mark.parametrize("case", _FOLLOWED)
def test_editing_each_followed_file_changes_the_next_cached_run(tmp_path, monkeypatch, case):
    migrated: list[str] = []
    real = runner.process

    def counting(job, plan, seen=None):
        migrated.append(job.display)
        return real(job, plan, seen)

    monkeypatch.setattr(runner, "process", counting)
    package = _build(tmp_path, case.split("-")[0])
    plan = Plan(select_rules(["NPU703"]), None, Mode.DIFF)
    first = _cached_run(package, plan, tmp_path)
    assert "_npu_rotary_mul(" in first.diff
    assert _cached_run(package, plan, tmp_path) == first and migrated == ["model.py"]  # from the cache
    edited, text = _FOLLOWED[case]
    (package / edited).write_text(text, encoding="utf-8")
    second = _cached_run(package, plan, tmp_path)
    assert migrated == ["model.py", "model.py"]  # model.py unchanged, the entry did not answer
    assert second.diff == "" and any("not fused" in f.message for f in second.findings), second.findings


def _declined(tmp_path, files: dict[str, str]) -> str:
    return _declined_in(_package(tmp_path, files))


def _declined_in(package: Path) -> str:
    text, findings = _migrate(package / "model.py")
    assert not _fused(findings) and "_npu_rotary_mul" not in text, _messages(findings)
    (message,) = [m for m in _messages(findings) if "not fused" in m]
    assert "; to fuse it, " in message or "; nothing in the code can: " in message
    return message


def test_a_later_star_import_may_rebind_the_module_so_it_is_not_followed(tmp_path):
    message = _declined(tmp_path, {"rope.py": ROPE, "other.py": "", "model.py": ATTRIBUTE + "\nfrom .other import *\n"})
    assert (
        "`rope.rotate_half` is imported from `.rope`, but a later `from .other import *` of this file may rebind `rope`"
        in message
    )


def test_a_global_statement_that_may_rebind_the_module_leaves_it_unfollowed(tmp_path):
    rebind = "\n\ndef other():\n    global rope\n    rope = None\n"
    message = _declined(tmp_path, {"rope.py": ROPE, "model.py": ATTRIBUTE + rebind})
    assert "`global rope` in a function of this file may rebind `rope`" in message


@pytest.mark.parametrize(
    "patch",
    [
        "rope.rotate_half = swap\n",
        "def install():\n    rope.rotate_half = swap\n",
        "setattr(rope, 'rotate_half', swap)\n",
        "setattr(rope, NAME, swap)\n",
    ],
    ids=["module level", "in a function", "setattr", "setattr computed"],
)
def test_a_module_attribute_the_file_assigns_is_not_followed(tmp_path, patch):
    # the review's monkeypatch: `rope.rotate_half` replaced in the importing file (here by a swap without the
    # negation) was fused as the module's own rotation, and the kernel then computed another function
    swap = "\n\ndef swap(x):\n    x1, x2 = x.chunk(2, dim=-1)\n    return torch.cat((x2, x1), dim=-1)\n\n\n"
    message = _declined(tmp_path, {"rope.py": ROPE, "model.py": ATTRIBUTE + swap + patch})
    assert "`rope.rotate_half` is imported from `.rope`, but this file assigns `rope`'s attributes" in message


@pytest.mark.parametrize(
    "init, why",
    [
        ("rope = None\n", "binds `rope` itself"),
        ("from .other import *\n", "has a `from X import *`, which may bind it"),
        ("def f():\n    global rope\n", "has `global rope` in a function, which may bind it"),
    ],
)
def test_a_package_init_that_binds_the_name_is_what_the_import_gets(tmp_path, init, why):
    # `from . import rope` reads the package's attribute first: `rope = None` in `__init__.py` is what it gets.
    package = _package(tmp_path, {"rope.py": ROPE, "other.py": "", "model.py": ATTRIBUTE})
    (package / "__init__.py").write_text(init, encoding="utf-8")
    message = _declined_in(package)
    assert f"the package's `__init__.py` (whose `rope` the import gets first) {why}" in message
    assert message.endswith("; to fuse it, import `rotate_half` by name from its module")


def test_the_package_init_importing_the_submodule_itself_is_followed(tmp_path):
    package = _package(tmp_path, {"rope.py": ROPE, "model.py": ATTRIBUTE})
    (package / "__init__.py").write_text("from . import rope\n", encoding="utf-8")
    assert _fused(_migrate(package / "model.py")[1])


def test_a_local_import_rebound_in_the_body_is_not_followed(tmp_path):
    rebound = LOCAL.replace("    return q", "    rotate_half = torch.neg\n    return q")
    message = _declined(tmp_path, {"rope.py": ROPE, "model.py": rebound})
    assert "`rotate_half`" in message


@pytest.mark.parametrize(
    "layers, why",
    [
        (
            LAYERS.replace(
                "from .rope import rotate_half\n",
                "try:\n    from .rope import rotate_half\nexcept ImportError:\n    def rotate_half(x):\n        return x\n",
            ),
            "`rotate_half`, which `layers.py` calls, is imported by `layers.py` and bound 2 times at module level",
        ),
        (
            # the star after the import of `rotate_half`, before the def of `apply_rope` (which it leaves alone)
            LAYERS.replace("rotate_half\n", "rotate_half\nfrom .other import *\n", 1),
            "`rotate_half`, which `layers.py` calls, is imported from `.rope`, but a later `from .other import *` of "
            "`layers.py` may rebind it",
        ),
        (
            LAYERS + "\n\ndef other():\n    global rotate_half\n",
            "`rotate_half`, which `layers.py` calls, is imported from `.rope`, but `global rotate_half` in a function "
            "of `layers.py` may rebind it",
        ),
    ],
    ids=["try-fallback", "star", "global"],
)
def test_what_the_sibling_may_rebind_is_declined_with_the_reason(tmp_path, layers, why):
    message = _declined(tmp_path, {"rope.py": ROPE, "other.py": IDENTITY, "layers.py": layers, "model.py": THIRD})
    assert why in message, message


def test_imports_past_the_levels_followed_are_declined_not_silent(tmp_path):
    # model.py -> layers.py -> mid.py -> rope.py: the fourth module is past MAX_DEPTH.
    layers = (
        THIRD.replace("from .layers import apply_rope", "from .mid import apply")
        .replace("def apply(", "def apply_rope(")
        .replace("return apply_rope(", "return apply(")
    )
    message = _declined(
        tmp_path,
        {"rope.py": ROPE, "mid.py": LAYERS.replace("apply_rope", "apply"), "layers.py": layers, "model.py": THIRD},
    )
    assert "`rotate_half`, which `mid.py` calls, is imported from `.rope` by `mid.py`, 2 imports away" in message
    assert "; to fuse it, import the rotation from a module nearer the file migrated" in message


#: A complex rotation whose table is given x's sizes by a list comprehension (liger-kernel's Llama 4 vision
#: reference computes its shape so; this spelling is ours).
COMPREHENSION = """
import torch


def rotate(q, k, freqs):
    qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    kc = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
    dims = [n if axis in (1, qc.ndim - 1) else 1 for axis, n in enumerate(qc.shape)]
    freqs = freqs.reshape(*dims).to(qc.device)
    q_out = torch.view_as_real(qc * freqs).flatten(3)
    k_out = torch.view_as_real(kc * freqs).flatten(3)
    return q_out.type_as(q), k_out.type_as(k)
"""


def _exec(text: str, forced: bool, torch_npu=None) -> dict:
    namespace: dict = {"__name__": "rotate"}
    exec(compile(text, "rotate.py", "exec"), namespace)
    if forced:
        namespace["_is_npu"], namespace["torch_npu"] = (lambda x: True), torch_npu
    return namespace


def _complex_inputs(dtype, complex_table: bool = True):
    import torch

    generator = torch.Generator().manual_seed(7)
    q = (3 * torch.randn(2, 6, 3, 8, generator=generator)).to(dtype)
    k = (3 * torch.randn(2, 6, 1, 8, generator=generator)).to(dtype)
    theta = (torch.rand(6, 4, generator=generator) * 2 - 1) * 3.14159
    freqs = torch.polar(torch.ones_like(theta), theta) if complex_table else theta.cos()
    return q, k, freqs


@pytest.mark.integration  # runs the migrated code with torch
def test_a_table_shaped_by_a_comprehension_is_fused_and_a_broken_kernel_is_caught():
    import torch

    from npu_migrate.verify import reference

    torch_npu = reference.torch_npu_module()
    text, findings = migrate_text(COMPREHENSION, path="rotate.py", select=["NPU703"])
    assert _fused(findings), _messages(findings)
    assert 'rotary_mode="interleave"' in text
    assert migrate_text(text, path="rotate.py", select=["NPU703"])[0] == text  # idempotent
    for dtype, floor in ((torch.float32, 0.999), (torch.bfloat16, 0.99)):
        args = _complex_inputs(dtype)
        want = _exec(COMPREHENSION, False)["rotate"](*args)
        before = torch_npu.calls["npu_rotary_mul"]
        got = _exec(text, True, torch_npu)["rotate"](*args)
        assert torch_npu.calls["npu_rotary_mul"] - before == 2  # once for q, once for k
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and _cosine(a, b) >= floor
        kept = _exec(text, False)["rotate"](*args)
        assert all(torch.equal(a, b) for a, b in zip(kept, want))
    args = _complex_inputs(torch.float32)
    want = _exec(COMPREHENSION, False)["rotate"](*args)
    real = torch_npu.npu_rotary_mul
    torch_npu.npu_rotary_mul = lambda x, r1, r2, real=real, **kw: real(x, r1, -r2, **kw)
    try:
        broken = _exec(text, True, torch_npu)["rotate"](*args)
    finally:
        torch_npu.npu_rotary_mul = real
    assert _cosine(broken[0], want[0]) < 0.999
    paired = _exec(text.replace('rotary_mode="interleave"', 'rotary_mode="half"'), True, torch_npu)["rotate"](*args)
    assert _cosine(paired[0], want[0]) < 0.999


@pytest.mark.integration  # runs the migrated code with torch
@pytest.mark.parametrize("name", ["comprehension", "complex_rotary_fixture"])
def test_a_real_table_where_a_complex_one_is_read_falls_back_instead_of_crashing(name):
    """A complex rotation `xc * freqs` with a real `freqs` scales both parts (liger's reference is called
    exactly then: a cast dropped the imaginary part): the branch must not read `freqs.imag`, which raises."""
    import torch
    from conftest import FIXTURES

    from npu_migrate.verify import reference

    torch_npu = reference.torch_npu_module()
    if name == "comprehension":
        source, function = COMPREHENSION, "rotate"
        args = _complex_inputs(torch.float32, complex_table=False)
    else:
        source = (FIXTURES / "rules" / "NPU703" / "complex_rotary.in.py").read_text(encoding="utf-8")
        function = "apply_rotary_emb"
        generator = torch.Generator().manual_seed(8)
        q, k = torch.randn(2, 6, 3, 8, generator=generator), torch.randn(2, 6, 1, 8, generator=generator)
        args = (q, k, torch.rand(6, 4, generator=generator))
    text, findings = migrate_text(source, path="rotate.py", select=["NPU703"])
    assert "torch.is_complex(" in text
    want = _exec(source, False)[function](*args)
    before = torch_npu.calls["npu_rotary_mul"]
    got = _exec(text, True, torch_npu)[function](*args)
    assert torch_npu.calls["npu_rotary_mul"] == before  # the original ran
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # The check can fail: without the dtype test the branch reads `.imag` of a real tensor.
    unguarded = text.replace("torch.is_complex(", "True or torch.is_complex(")
    with pytest.raises(RuntimeError, match="imag"):
        _exec(unguarded, True, torch_npu)[function](*args)


#: Our own rotations shaped as the silent diffusers sites were: per sample in a loop (Wan Animate 2's
#: `rope_apply`), and on x of [B, S, C] with the dims named from the front (LTX / LTX 2).
PER_SAMPLE = """
import torch


def rope_per_sample(x, lengths, freqs):
    out = []
    for b, n in enumerate(lengths.tolist()):
        xc = torch.view_as_complex(x[b, :n].to(torch.float64).reshape(n, x.size(2), -1, 2))
        rotated = torch.view_as_real(xc * freqs[:n]).flatten(2)
        out.append(torch.cat([rotated, x[b, n:]]))
    return torch.stack(out).float()
"""

FRONT_DIMS = """
import torch


def rope_front(x, cos, sin):
    even, odd = x.unflatten(2, (-1, 2)).unbind(-1)
    turned = torch.stack([-odd, even], dim=-1).flatten(2)
    return (x.float() * cos + turned.float() * sin).to(x.dtype)
"""

#: FRONT_DIMS as its finding's remedy says: the dims counted from the end (x then 4-D).
FROM_THE_END = FRONT_DIMS.replace("unflatten(2,", "unflatten(-1,").replace("flatten(2)", "flatten(-2)")


def _finding(source: str) -> str:
    text, findings = migrate_text(source, path="rotate.py", select=["NPU703"])
    assert "_npu_rotary_mul(" not in text.split("def rope_", 1)[1], text
    (message,) = [m for m in _messages(findings) if "not fused" in m]
    return message


def test_a_rotation_in_a_loop_is_declined_with_the_reason_not_silent():
    message = _finding(PER_SAMPLE)
    assert message.startswith("rotary embedding inside `for b, n in enumerate(lengths.tolist()):` not fused:")
    assert "(this rotation is computed in float64)" in message
    assert "; to fuse it, rotate in a function of its own that the loop calls" in message
    # Not said of a loop that rotates nothing: no complex product, no `rotate*` helper times a table.
    plain = PER_SAMPLE.replace("torch.view_as_complex(", "torch.abs(").replace("xc * freqs[:n]", "xc + freqs[:n]")
    assert not [m for m in _messages(migrate_text(plain, path="rotate.py", select=["NPU703"])[1]) if "loop" in m]


def test_dims_named_from_the_front_are_declined_with_a_remedy_that_holds():
    # `unflatten(2, ...)` / `flatten(2)` rotate the last dim only of a 3-D x; counted from the end the same
    # code is fused, so that is the reason and the remedy (not the 3-D run's per-head one, which is untrue here)
    message = _finding(FRONT_DIMS)
    assert "it names the dims it splits and joins from the front (`.unflatten(2, (-1, 2))`, `.flatten(2)`)" in message
    assert "the last one only of a 3-D tensor" in message
    assert "viewed per head" not in message
    # The sign dropped: never fused, at 3-D or counted from the end.
    for source in (FRONT_DIMS, FROM_THE_END):
        swapped = source.replace("[-odd, even]", "[odd, even]")
        assert not _fused(migrate_text(swapped, path="rotate.py", select=["NPU703"])[1])
    # The remedy: counted from the end, it is fused.
    text, findings = migrate_text(FROM_THE_END, path="rotate.py", select=["NPU703"])
    assert _fused(findings) and 'rotary_mode="interleave"' in text, _messages(findings)


@pytest.mark.integration  # runs the migrated code with torch
def test_the_remedied_spelling_agrees_with_the_original_and_a_broken_branch_is_caught():
    import torch

    from npu_migrate.verify import reference

    torch_npu = reference.torch_npu_module()
    text, _ = migrate_text(FROM_THE_END, path="rotate.py", select=["NPU703"])
    generator = torch.Generator().manual_seed(9)
    theta = ((torch.rand(1, 6, 1, 4, generator=generator) * 2 - 1) * 3.14159).repeat_interleave(2, dim=-1)
    x = 3 * torch.randn(2, 6, 3, 8, generator=generator)
    for dtype, floor in ((torch.float32, 0.999), (torch.bfloat16, 0.99)):
        # fp32 tables: the code rotates `x.float()`, and the kernel takes x and tables of one dtype
        args = (x.to(dtype), theta.cos(), theta.sin())
        want = _exec(FROM_THE_END, False)["rope_front"](*args)
        before = torch_npu.calls["npu_rotary_mul"]
        got = _exec(text, True, torch_npu)["rope_front"](*args)
        assert torch_npu.calls["npu_rotary_mul"] - before == 1
        assert got.dtype == want.dtype and _cosine(got, want) >= floor
        assert torch.equal(_exec(text, False)["rope_front"](*args), want)
    args = (x, theta.cos(), theta.sin())
    want = _exec(FROM_THE_END, False)["rope_front"](*args)
    paired = _exec(text.replace('rotary_mode="interleave"', 'rotary_mode="half"'), True, torch_npu)["rope_front"](*args)
    assert _cosine(paired, want) < 0.999


@pytest.mark.parametrize(
    "source", [COMPREHENSION, PER_SAMPLE, FRONT_DIMS, FROM_THE_END], ids=["comprehension", "loop", "front", "end"]
)
def test_switching_the_screen_off_changes_nothing_on_these_spellings(source):
    from unittest import mock

    from npu_migrate.transforms.fused import rotary, rotary_tail

    def run():
        text, findings = migrate_text(source, path="rotate.py", select=["NPU703"])
        return text, [(f.line, f.message, f.fixed) for f in findings]

    screened = run()
    assert any(m for _, m, _ in screened[1] if "rotary" in m)  # not vacuous: each gets a finding
    with (
        mock.patch.object(rotary, "may_rotate", lambda fn: True),
        mock.patch.object(rotary_tail, "may_hold_site", lambda fn: True),
    ):
        assert run() == screened


@pytest.mark.parametrize(
    "where, import_line, call",
    [
        ("package/sub", "from PKG import rope", "rope"),  # absolute, from the package root
        ("package/sub", "from .. import rope", "rope"),  # relative, a level up
        ("script", "import rope", "rope"),  # a script's folder is on sys.path
        ("script", "import rope as r", "r"),
    ],
)
def test_each_spelling_of_a_module_import_reaches_its_file(tmp_path, where, import_line, call):
    from test_rotary_imports import _write

    model = ATTRIBUTE.replace("from . import rope", import_line).replace("rope.rotate_half", f"{call}.rotate_half")
    if where == "script":
        _write(tmp_path, {"rope.py": ROPE, "train.py": model})
        path = tmp_path / "train.py"
    else:
        package = _package(tmp_path, {"rope.py": ROPE, "sub/__init__.py": ""})
        path = package / "sub" / "model.py"
        path.write_text(textwrap.dedent(model).replace("PKG", package.name), encoding="utf-8")
    text, findings = _migrate(path)
    assert _fused(findings), _messages(findings)
    # ... and a module that is not there is declined with the reason, not silent
    (path.parent / "rope.py" if where == "script" else path.parent.parent / "rope.py").unlink()
    _, findings = _migrate(path)
    assert not _fused(findings)
    assert any("which is no readable Python file next to this one" in m for m in _messages(findings)), _messages(
        findings
    )
