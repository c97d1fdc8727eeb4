"""The module-level helpers fused branches call: the code written once per file after its imports, or once
per package into its helper module (`helper_location.MODULE`), which the package's files import.

A branch calls `_is_npu(x)` (the prelude) and, for each torch_npu kernel, the typed function
`_npu_<kernel>` of `kernels/npu_<kernel>.py.j2`, whose signature is the kernel's own: the one place
that reaches `torch_npu.npu_<kernel>`, marked `@torch.jit.unused` so that TorchScript, for which
`_is_npu` is always False, compiles it as a stub. Idioms add helpers of their own (`_npu_rotary_fits`,
`_npu_sdpa`), declared in their `Idiom.helpers`; `_npu_causal_mask` is the attention helpers' shared one.
Which kernel functions a branch needs is read from the names its code calls, and which helpers a helper
needs from the names its template calls (`fused.with_called_helpers`): a helper goes nowhere without them.

Every rendered line is at most 79 columns (PEP 8's width, `layout.NARROWEST`), so the helpers fit any
file, and the package's helper module, without being laid out again; `tests/test_layout.py` measures them.

Signatures TorchScript must read without compiling the body are type comments (`# type: (Tensor) -> bool`):
TorchScript cannot resolve the string annotations of a `@torch.jit.unused` function in a file with
`from __future__ import annotations`, and in a type comment it knows `Tensor`, `Optional`, `Tuple` and
`Any` without a `typing` import in the user's file. Such a comment must be one line (TorchScript reads a
`@torch.jit.unused` function's PEP 484 per-parameter comments wrong), so where the real types would not fit
79 columns the parameters are `Any`: TorchScript's stub of the function never runs, only its return type
counts. A compiled helper (`_npu_sdpa`) with a signature too long for one line has one parameter a line,
each with its own `# type:` comment and `# type: (...) -> <return type>` under them, which TorchScript's
compiler reads.
"""

from __future__ import annotations

import ast
import copy
import functools
from importlib import resources

PRELUDE = "fused/prelude.py.j2"
#: `_npu_causal_mask(device)`, the kernel's compressed causal mask made once per device: one cache for
#: every attention helper that needs it (`_npu_fusion_sdpa`, flash-attn's `_npu_fusion_flash`).
CAUSAL_MASK = "fused/causal_mask.py.j2"
#: One template per kernel, `kernels/npu_<kernel>.py.j2`, defining `_npu_<kernel>`.
_KERNELS = "fused/kernels"


def kernel_function(kernel: str) -> str:
    """The function a branch calls to run torch_npu's `kernel` (`npu_rms_norm` -> `_npu_rms_norm`)."""
    return f"_{kernel}"


@functools.cache
def kernel_templates() -> dict[str, str]:
    """Kernel function name -> its template."""
    folder = resources.files("npu_migrate.templates").joinpath(*_KERNELS.split("/"))
    return {
        kernel_function(entry.name.removesuffix(".py.j2")): f"{_KERNELS}/{entry.name}"
        for entry in folder.iterdir()
        if entry.name.endswith(".py.j2")
    }


@functools.cache
def rendered(template: str, import_torch_npu: bool = False, torch_npu_imported: bool = False) -> str:
    """`template`'s code; the prelude with its guarded torch_npu import if `import_torch_npu`, and without
    the test of that import's fallback (`torch_npu is None`, dead code there) where the file imports
    torch_npu unconditionally (`torch_npu_imported`)."""
    from npu_migrate.engine.templating import render  # jinja2 costs 30 ms of start-up; most runs never render

    code = render(template, import_torch_npu=import_torch_npu, torch_npu_imported=torch_npu_imported)
    return code.strip() + "\n"


def names_in(code: str) -> set[str]:
    """The names `code` reads (the helpers and kernel functions it calls among them)."""
    return {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}


@functools.cache
def names_in_template(template: str) -> frozenset[str]:
    """The names a helper template's code reads, parsed once per process (every applied site asks)."""
    return frozenset(names_in(rendered(template)))


def kernels_called(code: str) -> list[str]:
    """The templates of the kernel functions `code` calls."""
    names = {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}
    return [template for name, template in kernel_templates().items() if name in names]


def helper_code(templates: list[str], import_torch_npu: bool, torch_npu_imported: bool = False) -> str:
    """The block a file gets after its imports: the helpers, two blank lines apart, the prelude's guarded
    torch_npu import included if `import_torch_npu`; `torch_npu_imported`: the file imports it unconditionally."""
    return "\n\n".join(
        rendered(t, import_torch_npu=import_torch_npu and t == PRELUDE, torch_npu_imported=torch_npu_imported)
        for t in templates
    )


# -- the helper module of a package ----------------------------------------------------------------------

#: The module a package's migrated files import their helpers from, written once at the top of the package.
MODULE_HEADER = "fused/module_header.py.j2"


def imported_helpers(tree: ast.Module, module: str) -> list[str]:
    """The names the top-level `from <module> import ...` statements of `tree` import (by their own names)."""
    return [
        alias.name
        for stmt in tree.body
        if isinstance(stmt, ast.ImportFrom) and "." * stmt.level + (stmt.module or "") == module
        for alias in stmt.names
        if alias.asname is None
    ]


def definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """The module-level defs, classes and assignments to one name of `tree`, by name: the last one where a
    name is bound twice, as at run time."""
    return {name: stmt for stmt in tree.body if (name := defined_name(stmt)) is not None}


def defined_name(stmt: ast.stmt) -> str | None:
    """The name a module-level def, class or assignment to one name binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None


def parse_typed(code: str) -> ast.Module:
    """`code` parsed with its type comments, which TorchScript reads: part of what a helper is."""
    return ast.parse(code, type_comments=True)


def definition_key(stmt: ast.stmt) -> str:
    """What a helper's definition (parsed by `parse_typed`) is, for telling whether two copies differ:
    its `ast` with type comments, without positions, comments, layout or docstrings."""
    return ast.dump(_without_docstrings(stmt))


def _without_docstrings(stmt: ast.stmt) -> ast.stmt:
    stripped = copy.deepcopy(stmt)
    for node in ast.walk(stripped):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return stripped


def defined_names(tree: ast.Module) -> set[str]:
    """The module-level defs and classes of `tree`."""
    return {stmt.name for stmt in tree.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def module_text(existing: str | None, templates: list[str], folder: bool = False) -> str:
    """The helper module holding `templates` (the prelude first): `existing` with what it lacks appended
    (what is there, the user's edits included, stays as it is), or a new module with its header (a script
    folder's sibling module's if `folder`) and the guarded torch_npu import. `templates` name only helpers
    whose names `existing` does not define."""
    if existing is None:
        from npu_migrate.engine.templating import render

        parts = [render(MODULE_HEADER, folder=folder, prelude=PRELUDE in templates).strip()]
        parts += [rendered(t, import_torch_npu=t == PRELUDE).rstrip("\n") for t in templates]
        return "\n\n\n".join(parts) + "\n"
    if not templates:
        return existing
    guard = "import torch_npu" not in existing  # a module whose prelude was deleted, say
    added = "\n\n\n".join(rendered(t, import_torch_npu=guard and t == PRELUDE).rstrip("\n") for t in templates)
    return existing.rstrip("\n") + "\n\n\n" + added + "\n"
