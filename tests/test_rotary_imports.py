"""Issue #23: NPU703 sees through a rotary helper imported from a sibling module (`from .rope import
rotate_half`, `from .layers import apply_rotary_emb`, a script folder's `from model_utils import ...`),
read with `ast` and never imported; the branch goes at the call site, in the file being migrated. The
result cache keys such a file's result by the sibling's content too.

The migrated package is imported with `_is_npu` forced true and verify's CPU reference kernels as
`torch_npu`, as in test_rotary_meaning.py; a deliberately broken kernel shows the comparison can fail.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from npu_migrate.engine import runner
from npu_migrate.engine.cache import Cache
from npu_migrate.engine.pipeline import Job, Mode, Plan, migrate_text
from npu_migrate.engine.registry import select_rules

ROPE = """
import torch


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
"""

HALF = """
import torch

from .rope import rotate_half


def apply(q, cos, sin):
    return q * cos + rotate_half(q) * sin
"""

PAIR = """
import torch

from .rope import apply_rotary_pos_emb as rope


def attend(q, k, cos, sin):
    q, k = rope(q, k, cos, sin, unsqueeze_dim=1)
    return q, k
"""

_packages = itertools.count()


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package of `files` (with an `__init__.py`) under a fresh name, so that imports do not collide."""
    package = tmp_path / f"rotary_pkg{next(_packages)}"
    _write(package, {"__init__.py": "", **files})
    return package


def _migrate(path: Path, **kw) -> tuple[str, list]:
    return migrate_text(path.read_text(encoding="utf-8"), path=str(path), select=["NPU703"], **kw)


def _messages(findings) -> list[str]:
    return [f.message for f in findings if f.rule_id == "NPU703"]


def _fused(findings) -> bool:
    return any(f.fixed and "gets a fused" in f.message for f in findings)


def _import(package: Path, module: str):
    sys.path.insert(0, str(package.parent))
    try:
        return importlib.import_module(f"{package.name}.{module}")
    finally:
        sys.path.remove(str(package.parent))


@pytest.mark.integration  # runs the migrated code with torch
def test_a_helper_imported_from_a_sibling_module_is_fused_at_the_call_site(tmp_path):
    import torch

    from npu_migrate.verify import reference

    package = _package(tmp_path, {"rope.py": ROPE, "model.py": HALF, "pair.py": PAIR})
    rope_before = (package / "rope.py").read_text()
    for module, function in (("model", "apply"), ("pair", "attend")):
        text, findings = _migrate(package / f"{module}.py")
        assert _fused(findings), _messages(findings)
        body = text.split(f"def {function}(", 1)[1]
        assert "_npu_rotary_mul(" in body, body  # the branch is at the call site; the helper stays the fallback
        assert _migrate_text_again(text, package / f"{module}.py") == text  # idempotent
        (package / f"{module}.py").write_text(text, encoding="utf-8")
    assert (package / "rope.py").read_text() == rope_before  # the sibling is read, never written

    torch_npu = reference.torch_npu_module()
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    cos, sin = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    original = _import(package, "rope")
    expected = original.apply_rotary_pos_emb(q, k, cos, sin)
    for module, call in (
        ("model", lambda m: (m.apply(q, cos.unsqueeze(1), sin.unsqueeze(1)), expected[0])),
        ("pair", lambda m: (m.attend(q, k, cos, sin), expected)),
    ):
        migrated = _import(package, module)
        off, _ = call(migrated)
        migrated._is_npu, migrated.torch_npu = (lambda x: True), torch_npu
        before = torch_npu.calls["npu_rotary_mul"]
        got, want = call(migrated)
        assert torch_npu.calls["npu_rotary_mul"] > before  # the kernel ran, not the fallback
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(a, b)
        # The check can fail: a kernel that rotates the wrong way round is caught.
        real = torch_npu.npu_rotary_mul
        torch_npu.npu_rotary_mul = lambda x, r1, r2, real=real, **kw: real(x, r1, -r2, **kw)
        try:
            broken, _ = call(migrated)
            first = broken[0] if isinstance(broken, tuple) else broken
            assert not torch.allclose(first, want[0] if isinstance(want, tuple) else want)
        finally:
            torch_npu.npu_rotary_mul = real
        migrated._is_npu = lambda x: False
        kept, _ = call(migrated)
        assert all(torch.equal(a, b) for a, b in zip(kept, off)) if isinstance(kept, tuple) else torch.equal(kept, off)


def _migrate_text_again(text: str, path: Path) -> str:
    return migrate_text(text, path=str(path), select=["NPU703"])[0]


def test_a_script_folder_imports_its_sibling_by_an_absolute_name(tmp_path):
    _write(
        tmp_path,
        {
            "model_utils.py": ROPE,
            "train.py": HALF.replace("from .rope import", "from model_utils import"),
        },
    )
    text, findings = _migrate(tmp_path / "train.py")
    assert _fused(findings), _messages(findings)
    assert "_npu_rotary_mul(q, cos, sin" in text


def test_an_absolute_import_in_a_package_resolves_from_the_package_root(tmp_path):
    # `from pkg.rope import rotate_half` in pkg/sub/model.py: pkg/rope.py, not pkg/sub/pkg/rope.py; a
    # `rope.py` next to the file is not what `from rope import` reaches inside a package.
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "rope.py": ROPE,
            "sub/__init__.py": "",
            "sub/model.py": HALF.replace("from .rope import", "from pkg.rope import"),
            "sub/rope.py": ROPE.replace("(-x2, x1)", "(x1, x2)"),  # no rotation: must not be the one read
            "sub/other.py": HALF.replace("from .rope import", "from rope import"),
        },
    )
    _, findings = _migrate(tmp_path / "pkg" / "sub" / "model.py")
    assert _fused(findings), _messages(findings)
    _, findings = _migrate(tmp_path / "pkg" / "sub" / "other.py")
    assert not _fused(findings)
    assert any(
        "`rotate_half` is imported from `rope`, which is no readable Python file" in m for m in _messages(findings)
    )


def test_stdin_declines_with_a_reason_and_a_remedy():
    _, findings = migrate_text(textwrap.dedent(HALF), path="<stdin>", select=["NPU703"])
    (message,) = [m for m in _messages(findings) if "not fused" in m]
    assert "imported from a module the tool cannot read" in message
    assert message.endswith("; to fuse it, migrate the file by its path (not from stdin)")


def test_a_sibling_helper_that_is_no_rotation_is_declined_as_read(tmp_path):
    package = _package(tmp_path, {"rope.py": ROPE.replace("(-x2, x1)", "(x2, x1)"), "model.py": HALF})
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings)
    (message,) = [m for m in _messages(findings) if "not fused" in m]
    assert "; nothing in the code can: " in message or "; to fuse it, " in message


def test_a_name_only_the_sibling_binds_is_not_copied_into_the_branch(tmp_path):
    rope = ROPE + textwrap.dedent(
        """

        SCALE = 2.0


        def scaled(q, cos, sin):
            return q * cos + rotate_half(q) * (sin * SCALE)
        """
    )
    model = HALF.replace("import rotate_half", "import scaled").replace(
        "return q * cos + rotate_half(q) * sin", "return scaled(q, cos, sin)"
    )
    package = _package(tmp_path, {"rope.py": rope, "model.py": model})
    text, findings = _migrate(package / "model.py")
    assert not _fused(findings) and "SCALE" not in text
    assert any(
        "would read `SCALE`, which `rope.py`" in m and "; to fuse it, bind `SCALE`" in m for m in _messages(findings)
    )


def test_the_sibling_is_parsed_never_imported(tmp_path):
    package = _package(tmp_path, {"rope.py": "raise SystemExit('imported!')\n" + ROPE, "model.py": HALF})
    _, findings = _migrate(package / "model.py")
    assert _fused(findings)  # reading it ran nothing


def test_a_syntax_error_or_a_huge_sibling_is_declined(tmp_path):
    from npu_migrate.transforms.fused.imported import MAX_BYTES

    package = _package(tmp_path, {"rope.py": ROPE + "\ndef broken(:\n", "model.py": HALF})
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings) and any("`.rope`, which does not parse" in m for m in _messages(findings))
    (package / "rope.py").write_text(textwrap.dedent(ROPE) + "#" * MAX_BYTES + "\n")
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings) and any("no readable Python file" in m for m in _messages(findings))


def _cached_run(package: Path, plan: Plan, root: Path):
    jobs = [Job(package / "model.py", "model.py")]
    return list(runner.run(jobs, plan, 1, Cache.open(root, plan)))[0]


def test_editing_the_sibling_changes_the_next_cached_run(tmp_path, monkeypatch):
    migrated: list[str] = []
    real = runner.process

    def counting(job, plan, seen=None):
        migrated.append(job.display)
        return real(job, plan, seen)

    monkeypatch.setattr(runner, "process", counting)
    package = _package(tmp_path, {"rope.py": ROPE, "model.py": HALF})
    plan = Plan(select_rules(["NPU703"]), None, Mode.DIFF)
    first = _cached_run(package, plan, tmp_path)
    assert "_npu_rotary_mul(q, cos, sin" in first.diff
    assert _cached_run(package, plan, tmp_path) == first and migrated == ["model.py"]  # answered from the cache
    # model.py is unchanged, rope.py no longer rotates: the entry must not answer.
    (package / "rope.py").write_text(textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)"), encoding="utf-8")
    second = _cached_run(package, plan, tmp_path)
    assert migrated == ["model.py", "model.py"]
    assert second.diff == "" and any("not fused" in f.message for f in second.findings)
    assert second == list(runner.run([Job(package / "model.py", "model.py")], plan, 1))[0]  # as without a cache
    # And back: the first result again, and a sibling that appears where none was is seen too.
    (package / "rope.py").write_text(textwrap.dedent(ROPE), encoding="utf-8")
    assert _cached_run(package, plan, tmp_path).diff == first.diff
    (package / "rope.py").unlink()
    (package / "rope").mkdir()
    (package / "rope" / "__init__.py").write_text(textwrap.dedent(ROPE).replace("(-x2, x1)", "(x2, x1)"))
    assert _cached_run(package, plan, tmp_path).diff == ""


@pytest.mark.integration  # runs the migrated fixture with torch
def test_a_staticmethod_rotation_fuses_both_tensors_and_a_broken_kernel_is_caught():
    """torchtitan's spelling: `apply_rotary_emb(query, key, cache)` and `_rotate_half` staticmethods of the
    class (the first parameter is no instance; `Class._rotate_half(x)` is inlined)."""
    import torch
    from conftest import FIXTURES

    from npu_migrate.verify import reference

    torch_npu = reference.torch_npu_module()
    folder = FIXTURES / "rules" / "NPU703"
    original, migrated = {}, {}
    exec(compile((folder / "static_helper.in.py").read_text(), "in.py", "exec"), original)
    exec(compile((folder / "static_helper.out.py").read_text(), "out.py", "exec"), migrated)
    migrated["_is_npu"], migrated["torch_npu"] = (lambda x: True), torch_npu
    q, k, cache = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 8), torch.randn(1, 1, 5, 16)
    want = original["CosSinRope"].apply_rotary_emb(q, k, cache)
    before = torch_npu.calls["npu_rotary_mul"]
    got = migrated["CosSinRope"].apply_rotary_emb(q, k, cache)
    assert torch_npu.calls["npu_rotary_mul"] - before == 2  # query and key, not one of them
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    real = torch_npu.npu_rotary_mul
    torch_npu.npu_rotary_mul = lambda x, r1, r2, **kw: real(x, r1, -r2, **kw)
    try:
        broken = migrated["CosSinRope"].apply_rotary_emb(q, k, cache)
    finally:
        torch_npu.npu_rotary_mul = real
    assert not torch.allclose(broken[0], want[0])


IDENTITY = """
def rotate_half(x):
    return x
"""


def test_a_later_star_import_may_rebind_the_helper_so_nothing_is_followed(tmp_path):
    # Review r1: `from .other import *` after `from .rope import rotate_half` rebinds it to other's identity.
    starred = HALF.replace("from .rope import rotate_half\n", "from .rope import rotate_half\nfrom .other import *\n")
    package = _package(tmp_path, {"rope.py": ROPE, "other.py": IDENTITY, "model.py": starred})
    text, findings = _migrate(package / "model.py")
    assert not _fused(findings) and "_npu_rotary_mul" not in text
    assert any(
        "`rotate_half` is imported from `.rope`, but a later `from .other import *` of this file may rebind it" in m
        and "; to fuse it, bind `rotate_half` after the `import *`" in m
        for m in _messages(findings)
    ), _messages(findings)
    x = object()
    assert _import(package, "model").rotate_half(x) is x  # what the call reaches at run time: no rotation

    # The star before the import: the import is the last binding, and is followed.
    first = HALF.replace("from .rope import rotate_half\n", "from .other import *\nfrom .rope import rotate_half\n")
    (package / "model.py").write_text(textwrap.dedent(first).lstrip(), encoding="utf-8")
    assert _fused(_migrate(package / "model.py")[1])

    # The sibling's own star import after its def: its `rotate_half` is not what `from .rope import` gets.
    (package / "rope.py").write_text(textwrap.dedent(ROPE) + "\nfrom .other import *\n", encoding="utf-8")
    (package / "model.py").write_text(textwrap.dedent(HALF).lstrip(), encoding="utf-8")
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings)
    assert any("where a later `from .other import *` may rebind `rotate_half`" in m for m in _messages(findings))
    # ...and a helper of the sibling that calls it is not inlined through it either.
    (package / "pair.py").write_text(textwrap.dedent(PAIR).lstrip(), encoding="utf-8")
    assert not _fused(_migrate(package / "pair.py")[1])


def test_a_star_import_after_a_local_helper_leaves_it_unfollowed(tmp_path):
    local = (
        textwrap.dedent(ROPE)
        + "\nfrom .other import *\n\n\ndef apply(q, cos, sin):\n    return q * cos + rotate_half(q) * sin\n"
    )
    package = _package(tmp_path, {"other.py": IDENTITY, "model.py": local})
    text, findings = _migrate(package / "model.py")
    assert not _fused(findings) and "_npu_rotary_mul" not in text
    assert any(
        "not fused: `rotate_half` is defined in this file, but a later `from .other import *` of this file may rebind it"
        in m
        for m in _messages(findings)
    ), _messages(findings)
    # Before the def, the def is the last binding.
    (package / "model.py").write_text(
        "from .other import *\n" + textwrap.dedent(local).replace("from .other import *", "")
    )
    assert _fused(_migrate(package / "model.py")[1])


def test_a_package_shadows_the_module_of_the_same_name(tmp_path, monkeypatch):
    # Review r2: `rope/__init__.py` and `rope.py` side by side: Python imports the package.
    package = _package(tmp_path, {"rope.py": ROPE, "rope/__init__.py": IDENTITY, "model.py": HALF})
    assert _import(package, "rope").__file__.endswith("__init__.py")
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings), _messages(findings)
    # A package too large to read is still the module: `rope.py` beside it is not read instead.
    from npu_migrate.transforms.fused.imported import MAX_BYTES

    (package / "rope" / "__init__.py").write_text(textwrap.dedent(ROPE) + "#" * MAX_BYTES + "\n")
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings) and any("no readable Python file" in m for m in _messages(findings))

    # The cache: both candidates are recorded, so a package appearing beside `rope.py` is seen.
    (package / "rope" / "__init__.py").unlink()
    (package / "rope").rmdir()
    plan = Plan(select_rules(["NPU703"]), None, Mode.DIFF)
    assert "_npu_rotary_mul(q, cos, sin" in _cached_run(package, plan, tmp_path).diff
    (package / "rope").mkdir()
    (package / "rope" / "__init__.py").write_text(textwrap.dedent(IDENTITY))
    assert _cached_run(package, plan, tmp_path).diff == ""


def test_a_global_statement_that_may_rebind_the_helper_leaves_it_unfollowed(tmp_path):
    # Review r4: `global rotate_half` in a function assigns the module's name when it runs.
    rebind = "\n\ndef use_identity():\n    global rotate_half\n    rotate_half = torch.clone\n"
    package = _package(tmp_path, {"rope.py": ROPE, "model.py": HALF + rebind})
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings)
    assert any(
        "`rotate_half` is imported from `.rope`, but `global rotate_half` in a function of this file may rebind it" in m
        and "; to fuse it, give what the `global rotate_half` statement assigns a name of its own" in m
        for m in _messages(findings)
    ), _messages(findings)
    # A def of the file itself.
    local = textwrap.dedent(ROPE) + rebind + "\n\ndef apply(q, cos, sin):\n    return q * cos + rotate_half(q) * sin\n"
    (package / "local.py").write_text(local, encoding="utf-8")
    _, findings = _migrate(package / "local.py")
    assert not _fused(findings)
    assert any("`rotate_half` is defined in this file, but `global rotate_half`" in m for m in _messages(findings))
    # The sibling's: `from .rope import rotate_half` may get what its function assigned.
    (package / "rope.py").write_text(textwrap.dedent(ROPE) + rebind, encoding="utf-8")
    _, findings = _migrate(package / "model.py")
    assert not _fused(findings)
    assert any("where `global rotate_half` in a function may rebind it" in m for m in _messages(findings))
