#!/usr/bin/env python3
"""Regenerate ``transforms/data/torch_npu_api.toml`` from torch_npu wheels on PyPI.

The codemod needs to know which ``torch.npu`` / ``torch_npu`` names exist in
each torch_npu release, and which ``torch.cuda`` names they stand in for.  This
script records both without installing or importing torch_npu (it needs the
Ascend CANN runtime to import): it downloads each wheel with
``pip download --no-deps``, reads the Python sources and the op-schema YAML
straight out of the wheel zip, and parses them with ``ast`` / regular
expressions.  The ``torch.cuda`` surface is read the same way from the
installed torch (or ``--torch-root``), again without importing it.

Usage::

    .venv/bin/python scripts/generate_api_tables.py            # download + regenerate
    .venv/bin/python scripts/generate_api_tables.py --offline  # cached wheels only
    python3 scripts/generate_api_tables.py --versions 2.13.0 2.14.0 \\
        --torch-root .venv/lib/python3.11/site-packages/torch

Any Python 3.11+ works; the venv interpreter is only a convenient way to
locate the torch whose ``torch.cuda`` surface is recorded.

Wheels are cached in ``benchmarks/.cache/wheels`` (``--cache`` to change it).
A version that cannot be downloaded is skipped with a warning.  After writing,
the script prints which names were added or removed compared with the
previous TOML.  Standard library only (plus ``pip`` run as a subprocess).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from wheels import cached_wheel, download_wheel

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO_ROOT / "benchmarks" / ".cache" / "wheels"
DEFAULT_OUTPUT = REPO_ROOT / "transforms" / "data" / "torch_npu_api.toml"

# Newest release of each torch_npu line, plus 2.1.0.post8 because it is the
# oldest wheel still widely deployed and lacks the NPUGraph family.
DEFAULT_VERSIONS = [
    "2.1.0.post8",
    "2.1.0.post17",
    "2.3.1.post6",
    "2.4.0.post4",
    "2.5.1.post1",
    "2.6.0.post5",
    "2.7.1.post11",
    "2.8.0.post5",
    "2.9.1",
    "2.10.0.post7",
    "2.11.0.post3",
    "2.12.0.post3",
    "2.13.0",
    "2.14.0",
]

# Older lines are published as manylinux2014 wheels, newer ones as
# manylinux_2_28; aarch64 is the fallback because some releases were built
# for Kunpeng hosts first.  The Python sources are the same across platforms.
PACKAGE = "torch_npu"
PLATFORM_GROUPS = [
    ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"],
    ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"],
]

# Ops whose full schema the fused-op transforms check before rewriting.
SCHEMA_OPS = [
    "npu_rms_norm",
    "npu_add_rms_norm",
    "npu_gemma_rms_norm",
    "npu_swiglu",
    "npu_rotary_mul",
    "npu_fusion_attention",
    "npu_fusion_attention_v2",
    "npu_apply_rotary_pos_emb",
    "npu_geglu",
    "npu_gelu",
    "npu_fast_gelu",
    "npu_scaled_masked_softmax",
    "npu_prompt_flash_attention",
    "npu_incre_flash_attention",
    "npu_fused_infer_attention_score",
    # Not rewritten by default, but opt-in MoE / transpose rewrites gate on them.
    "npu_confusion_transpose",
    "npu_moe_gating_top_k_softmax",
    "npu_moe_init_routing",
    "npu_moe_finalize_routing",
    "npu_grouped_matmul",
]

NPU_PACKAGE = "torch_npu/npu"
NPU_INIT = f"{NPU_PACKAGE}/__init__.py"
NPU_AMP_INIT = f"{NPU_PACKAGE}/amp/__init__.py"
DISTRIBUTED_INIT = "torch_npu/distributed/__init__.py"
CODEGEN_YAML = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
OP_PLUGIN_DOCS = "torch_npu/_op_plugin_docs.py"
EXPOSED_API = "torch_npu/utils/exposed_api.py"


class GenerationError(Exception):
    """A failure that should stop the run with a readable message."""


# --------------------------------------------------------------------------
# PEP 440 ordering (stdlib has no `packaging`)
# --------------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"^(?P<release>\d+(?:\.\d+)*)"
    r"(?:(?P<pre_label>a|b|rc)(?P<pre_num>\d+))?"
    r"(?:\.post(?P<post>\d+))?"
    r"(?:\.dev(?P<dev>\d+))?$"
)


def version_key(version: str) -> tuple:
    """Sort key following PEP 440 for the forms torch_npu uses (X.Y.Z[rcN][.postN][.devN])."""
    match = _VERSION_RE.match(version)
    if not match:
        raise GenerationError(f"unsupported version string {version!r}")
    release = tuple(int(part) for part in match["release"].split("."))
    release += (0,) * (4 - len(release))
    # A final release sorts after its pre-releases; a dev build before everything else.
    if match["pre_label"]:
        pre = ({"a": 0, "b": 1, "rc": 2}[match["pre_label"]], int(match["pre_num"]))
    elif match["dev"] and not match["post"]:
        pre = (-1, 0)
    else:
        pre = (3, 0)
    post = int(match["post"]) if match["post"] else -1
    dev = int(match["dev"]) if match["dev"] else sys.maxsize
    return release, pre, post, dev


# --------------------------------------------------------------------------
# TOML writer
# --------------------------------------------------------------------------

_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_INLINE_LIST_LIMIT = 80


def _toml_key(key: str) -> str:
    return key if _BARE_KEY_RE.match(key) else _toml_string(key)


def _toml_string(value: str) -> str:
    escaped = []
    for char in value:
        if char in '"\\':
            escaped.append("\\" + char)
        elif char == "\n":
            escaped.append("\\n")
        elif char == "\t":
            escaped.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _toml_value(value, indent: str = "") -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        items = [_toml_value(item) for item in value]
        inline = "[" + ", ".join(items) + "]"
        # Long lists go one item per line so that regenerations diff per name.
        if len(inline) <= _INLINE_LIST_LIMIT:
            return inline
        return "[\n" + "".join(f"{indent}    {item},\n" for item in items) + f"{indent}]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_toml(data: dict, header: str = "") -> str:
    """Serialise nested dicts of str / bool / list[str] to TOML.

    Scalars and lists of a table are written before its sub-tables, as TOML
    requires; a table that holds only sub-tables gets no header of its own.
    Key order is the dict's insertion order, so callers control stability.
    """
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]

    def emit(table: dict, path: list[str]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        subtables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if path and (scalars or not subtables):
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_toml_key(part) for part in path) + "]")
        for key, value in scalars.items():
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        for key, value in subtables.items():
            emit(value, path + [key])

    emit(data, [])
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Static extraction helpers
# --------------------------------------------------------------------------


@dataclass
class NameList:
    """Names resolved from an ``__all__``-style expression, plus what could not be resolved."""

    names: set[str] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)


def _literal_strings(
    node: ast.AST, assigned: dict[str, ast.AST], result: NameList, source: str, seen: frozenset[str] = frozenset()
) -> None:
    """Collect string literals from a list/tuple expression, following + and local names."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for element in node.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, str):
                result.names.add(element.value)
            elif isinstance(element, ast.Starred):
                _literal_strings(element.value, assigned, result, source, seen)
            else:
                result.unresolved.append(f"{source}: {ast.unparse(element)}")
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        _literal_strings(node.left, assigned, result, source, seen)
        _literal_strings(node.right, assigned, result, source, seen)
    elif isinstance(node, ast.Name) and node.id in assigned and node.id not in seen:
        _literal_strings(assigned[node.id], assigned, result, source, seen | {node.id})
    else:
        result.unresolved.append(f"{source}: {ast.unparse(node)}")


def extract_all(tree: ast.Module, source: str) -> NameList | None:
    """Statically evaluate ``__all__`` in a module; None if the module defines none."""
    assigned: dict[str, ast.AST] = {}
    result = NameList()
    found = False
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
                    if target.id == "__all__":
                        found = True
                        # A plain assignment replaces whatever came before.
                        result = NameList()
                        _literal_strings(node.value, assigned, result, source)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            assigned[node.target.id] = node.value
            if node.target.id == "__all__":
                found = True
                result = NameList()
                _literal_strings(node.value, assigned, result, source)
        elif (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "__all__"
            and isinstance(node.op, ast.Add)
        ):
            found = True
            _literal_strings(node.value, assigned, result, source)
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id == "__all__"
        ):
            call = node.value
            found = True
            if call.func.attr == "extend" and len(call.args) == 1:
                _literal_strings(call.args[0], assigned, result, source)
            elif (
                call.func.attr == "append"
                and len(call.args) == 1
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[0].value, str)
            ):
                result.names.add(call.args[0].value)
            else:
                result.unresolved.append(f"{source}: {ast.unparse(call)}")
    return result if found else None


def _module_path(package: str, name: str, names: set[str]) -> str | None:
    """Wheel path of module ``name`` inside ``package`` (file or package), if present."""
    for candidate in (f"{package}/{name.replace('.', '/')}.py", f"{package}/{name.replace('.', '/')}/__init__.py"):
        if candidate in names:
            return candidate
    return None


def _public(name: str) -> bool:
    return not name.startswith("_")


def _lazy_getattr_names(function: ast.FunctionDef) -> set[str]:
    """Names a module-level ``__getattr__`` serves, from ``name == "x"`` / ``name in (...)`` tests."""
    if not function.args.args:
        return set()
    parameter = function.args.args[0].arg
    served = set()
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == parameter
            and len(node.comparators) == 1
        ):
            comparator = node.comparators[0]
            if isinstance(node.ops[0], ast.Eq) and isinstance(comparator, ast.Constant):
                served.add(comparator.value)
            elif isinstance(node.ops[0], ast.In) and isinstance(comparator, (ast.Tuple, ast.List, ast.Set)):
                served.update(e.value for e in comparator.elts if isinstance(e, ast.Constant))
    return {name for name in served if isinstance(name, str)}


def _star_import_names(module_path: str, wheel: zipfile.ZipFile, unresolved: list[str]) -> set[str]:
    """Names ``from module import *`` binds: its ``__all__``, else its public definitions.

    Without ``__all__`` Python would also re-export the module's own imports
    (``warnings``, ``torch``...); those are incidental, so only names the module
    defines itself are kept.
    """
    tree = ast.parse(wheel.read(module_path), module_path)
    explicit = extract_all(tree, module_path)
    if explicit is not None:
        unresolved.extend(explicit.unresolved)
        return explicit.names
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    return {name for name in defined if _public(name)}


def _submodules_imported_elsewhere(wheel: zipfile.ZipFile, names: set[str]) -> set[str]:
    """Public ``torch_npu.npu`` submodules that some module of the wheel imports.

    Importing ``torch_npu.npu.x`` from anywhere sets ``x`` as an attribute of
    the package, so such submodules are reachable as ``torch.npu.x`` even when
    ``npu/__init__.py`` never mentions them.
    """
    pattern = re.compile(
        r"^\s*(?:import\s+torch_npu\.npu\.(\w+)"
        r"|from\s+torch_npu\.npu\.(\w+)[\w.]*\s+import"
        r"|from\s+torch_npu\.npu\s+import\s+(?:\(([^)]*)\)|([\w \t,]+)))",
        re.M,
    )
    found = set()
    for path in names:
        if not (path.startswith("torch_npu/") and path.endswith(".py")):
            continue
        for match in pattern.finditer(wheel.read(path).decode("utf-8", "replace")):
            imported = match[3] or match[4]
            if imported:
                # `from torch_npu.npu import x as y` still binds x on the package.
                found.update(re.findall(r"(\w+)(?:\s+as\s+\w+)?", imported))
            else:
                found.add(match[1] or match[2])
    return {name for name in found if _public(name) and _module_path(NPU_PACKAGE, name, names)}


def npu_public_attributes(
    wheel: zipfile.ZipFile, tree: ast.Module, npu_all: set[str], unresolved: list[str]
) -> set[str]:
    """Public names of ``torch_npu.npu`` that are reachable but not listed in ``__all__``."""
    names = set(wheel.namelist())
    public = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                # `from .x import y` binds the submodule x on the package as a side effect.
                public.add(node.module.split(".")[0])
            for alias in node.names:
                if alias.name == "*":
                    module_path = _module_path(NPU_PACKAGE, node.module or "", names)
                    if module_path is None:
                        unresolved.append(f"{NPU_INIT}: from .{node.module} import * (module not in wheel)")
                    else:
                        public |= _star_import_names(module_path, wheel, unresolved)
                else:
                    public.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            # Only `import torch_npu.npu.x` exposes an npu attribute; `import os` etc. are incidental.
            for alias in node.names:
                if alias.name.startswith("torch_npu.npu."):
                    public.add(alias.name.split(".")[2])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                public |= _lazy_getattr_names(node)
            else:
                public.add(node.name)
        elif isinstance(node, ast.Assign):
            public.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            public.add(node.target.id)
    public |= _submodules_imported_elsewhere(wheel, names)
    return {name for name in public if _public(name) and name not in npu_all}


_FUNC_RE = re.compile(r"^\s*(?:-\s*)?func:\s*(?P<schema>\S.*?)\s*$", re.M)


def fused_ops_from_yaml(text: str) -> tuple[set[str], dict[str, str]]:
    """``npu_*`` op names and their overload-free schemas from the codegen YAML.

    Every op in that file is registered under ``torch.ops.npu`` and re-exported
    as ``torch_npu.<name>``.  PyYAML is not in the stdlib, but each schema sits
    on a single ``func:`` line, which a regular expression reads reliably.
    """
    ops = set()
    schemas = {}
    for match in _FUNC_RE.finditer(text):
        schema = match["schema"].strip("'\"")
        qualified = schema.split("(", 1)[0]
        name = qualified.split(".", 1)[0]
        if not name.startswith("npu_"):
            continue
        if "->" not in schema or schema.count("(") != schema.count(")"):
            raise GenerationError(f"schema for {name} spans several YAML lines: {schema!r}")
        ops.add(name)
        if "." not in qualified:
            schemas[name] = schema
    return ops, schemas


def fused_ops_from_docs(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Op names (and docstrings) from ``_add_torch_npu_docstr("name", doc)`` calls."""
    docs = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "_add_torch_npu_docstr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            doc = node.args[1].value if isinstance(node.args[1], ast.Constant) else ""
            docs[node.args[0].value] = doc if isinstance(doc, str) else ""
    return {name for name in docs if name.startswith("npu_")}, docs


# --------------------------------------------------------------------------
# Per-wheel and torch extraction
# --------------------------------------------------------------------------


def _parse_member(wheel: zipfile.ZipFile, path: str) -> ast.Module:
    try:
        return ast.parse(wheel.read(path), path)
    except KeyError:
        raise GenerationError(f"{wheel.filename}: {path} is missing") from None


def _required_all(tree: ast.Module, path: str, unresolved: list[str]) -> list[str]:
    names = extract_all(tree, path)
    if names is None:
        raise GenerationError(f"{path} defines no __all__")
    unresolved.extend(names.unresolved)
    return sorted(names.names)


def extract_all_like(tree: ast.Module, variable: str, unresolved: list[str]) -> set[str]:
    """Strings of a module-level list named ``variable`` (same rules as ``__all__``)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets):
            result = NameList()
            _literal_strings(node.value, {}, result, variable)
            unresolved.extend(result.unresolved)
            return result.names
    return set()


def extract_wheel(wheel_path: Path) -> dict:
    """The TOML table for one torch_npu wheel."""
    with zipfile.ZipFile(wheel_path) as wheel:
        members = set(wheel.namelist())
        unresolved: list[str] = []
        npu_tree = _parse_member(wheel, NPU_INIT)
        npu_all = _required_all(npu_tree, NPU_INIT, unresolved)
        attributes = npu_public_attributes(wheel, npu_tree, set(npu_all), unresolved)
        amp = _required_all(_parse_member(wheel, NPU_AMP_INIT), NPU_AMP_INIT, unresolved)
        distributed = _required_all(_parse_member(wheel, DISTRIBUTED_INIT), DISTRIBUTED_INIT, unresolved)

        if CODEGEN_YAML in members:
            source = CODEGEN_YAML
            ops, all_schemas = fused_ops_from_yaml(wheel.read(CODEGEN_YAML).decode("utf-8"))
            has_rotary_mode = "rotary_mode" in all_schemas.get("npu_rotary_mul", "")
        elif OP_PLUGIN_DOCS in members:
            # Docstrings carry no machine-readable schema, so none are recorded.
            source = OP_PLUGIN_DOCS
            ops, docs = fused_ops_from_docs(_parse_member(wheel, OP_PLUGIN_DOCS))
            all_schemas = {}
            has_rotary_mode = "rotary_mode" in docs.get("npu_rotary_mul", "")
        elif EXPOSED_API in members:
            source = f"{EXPOSED_API} (public_npu_functions)"
            exposed = extract_all_like(_parse_member(wheel, EXPOSED_API), "public_npu_functions", unresolved)
            ops = {name for name in exposed if name.startswith("npu_")}
            all_schemas = {}
            has_rotary_mode = False
        else:
            raise GenerationError(f"{wheel_path.name}: no source of fused op names found")

    table = {
        "wheel": wheel_path.name,
        "npu_all": npu_all,
        "npu_attributes": sorted(attributes),
        "npu_amp": amp,
        "distributed": distributed,
        "fused_ops": sorted(ops),
        "fused_ops_source": source,
        "rotary_mul_has_rotary_mode": has_rotary_mode,
    }
    if unresolved:
        table["unresolved"] = sorted(set(unresolved))
    table["fused_op_schemas"] = {op: all_schemas[op] for op in SCHEMA_OPS if op in all_schemas}
    return table


def find_torch_root(explicit: Path | None) -> Path:
    if explicit is not None:
        root = explicit
    else:
        # find_spec locates the package without executing torch/__init__.py.
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            raise GenerationError(
                "torch is not importable from this interpreter; run with the project venv "
                "(.venv/bin/python) or pass --torch-root .../site-packages/torch"
            )
        root = Path(list(spec.submodule_search_locations)[0])
    if not (root / "cuda" / "__init__.py").is_file():
        raise GenerationError(f"{root} does not look like a torch package (no cuda/__init__.py)")
    return root


def extract_torch(root: Path) -> tuple[str, dict]:
    """The reference torch version (without local label) and its torch.cuda surface."""
    unresolved: list[str] = []

    def module_all(relative: str) -> list[str]:
        path = root / relative
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        return _required_all(tree, f"torch/{relative}", unresolved)

    surface = {
        "all": module_all("cuda/__init__.py"),
        "amp": module_all("cuda/amp/__init__.py"),
        "backends_cuda": module_all("backends/cuda/__init__.py"),
    }
    if unresolved:
        raise GenerationError("could not resolve torch __all__ entries: " + "; ".join(unresolved))

    version_tree = ast.parse((root / "version.py").read_text(encoding="utf-8"))
    for node in version_tree.body:
        if (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Constant)
            and any(
                isinstance(t, ast.Name) and t.id == "__version__"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
        ):
            return str(node.value.value).split("+")[0], surface
    raise GenerationError(f"{root / 'version.py'} has no literal __version__")


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def _list_changes(label: str, old: dict, new: dict) -> list[str]:
    lines = []
    for key in sorted(set(old) | set(new)):
        old_value, new_value = old.get(key), new.get(key)
        if isinstance(new_value, dict) or isinstance(old_value, dict):
            lines += _list_changes(f"{label}.{key}", old_value or {}, new_value or {})
        elif isinstance(new_value, list) or isinstance(old_value, list):
            added = sorted(set(new_value or []) - set(old_value or []))
            removed = sorted(set(old_value or []) - set(new_value or []))
            if added:
                lines.append(f"  {label}.{key}: +{len(added)} {', '.join(added)}")
            if removed:
                lines.append(f"  {label}.{key}: -{len(removed)} {', '.join(removed)}")
        elif old_value is None:
            lines.append(f"  {label}.{key}: added {new_value!r}")
        elif new_value is None:
            lines.append(f"  {label}.{key}: removed (was {old_value!r})")
        elif old_value != new_value:
            lines.append(f"  {label}.{key}: {old_value!r} -> {new_value!r}")
    return lines


def summarise_changes(old: dict | None, new: dict) -> str:
    if old is None:
        return "no previous TOML; every entry is new"
    old_versions, new_versions = old.get("versions", {}), new["versions"]
    lines = []
    for version in sorted(set(new_versions) - set(old_versions), key=version_key):
        lines.append(f"  version added: {version}")
    for version in sorted(set(old_versions) - set(new_versions), key=version_key):
        lines.append(f"  version removed: {version}")
    lines += _list_changes("torch_cuda", old.get("torch_cuda", {}), new["torch_cuda"])
    lines += _list_changes("meta", old.get("meta", {}), new["meta"])
    for version in sorted(set(old_versions) & set(new_versions), key=version_key):
        lines += _list_changes(f"versions.{version}", old_versions[version], new_versions[version])
    return "\n".join(lines) if lines else "no changes"


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

HEADER = "Generated by scripts/generate_api_tables.py from the torch_npu wheels on PyPI. Do not edit by hand."


def build_tables(args: argparse.Namespace) -> dict:
    torch_version, torch_cuda = extract_torch(find_torch_root(args.torch_root))
    args.cache.mkdir(parents=True, exist_ok=True)
    versions = {}
    for version in sorted(set(args.versions), key=version_key):
        wheel = cached_wheel(args.cache, PACKAGE, version)
        if wheel is None and args.offline:
            print(f"warning: skipping torch_npu {version}: not in {args.cache} (--offline)", file=sys.stderr)
            continue
        if wheel is None:
            print(f"downloading torch_npu {version} ...", file=sys.stderr)
            wheel = download_wheel(args.cache, PACKAGE, version, PLATFORM_GROUPS)
            if wheel is None:
                continue
        versions[version] = extract_wheel(wheel)
        for entry in versions[version].get("unresolved", []):
            print(f"warning: {version}: could not resolve statically: {entry}", file=sys.stderr)
    if not versions:
        raise GenerationError("no torch_npu wheel could be read; nothing to write")
    ordered = list(versions)
    return {
        "meta": {
            "generated_by": "scripts/generate_api_tables.py",
            "torch_reference": torch_version,
            "versions": ordered,
            "default": ordered[-1],
        },
        "torch_cuda": torch_cuda,
        "versions": versions,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Regenerate transforms/data/torch_npu_api.toml from torch_npu wheels "
        "(read statically; torch_npu is never installed or imported)."
    )
    parser.add_argument(
        "--versions",
        nargs="+",
        default=DEFAULT_VERSIONS,
        metavar="V",
        help="torch_npu versions to record (default: newest of each line)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"wheel cache directory (default: {DEFAULT_CACHE.relative_to(REPO_ROOT)})",
    )
    parser.add_argument("--offline", action="store_true", help="use only wheels already in the cache; never call pip")
    parser.add_argument(
        "--torch-root",
        type=Path,
        help="path of the torch package whose torch.cuda surface is recorded "
        "(default: the torch this interpreter would import)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"TOML to write (default: {DEFAULT_OUTPUT.relative_to(REPO_ROOT)})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for version in args.versions:
            version_key(version)
        tables = build_tables(args)
        previous = None
        if args.output.exists():
            try:
                previous = tomllib.loads(args.output.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as error:
                print(
                    f"warning: existing {args.output} is not valid TOML ({error}); not diffing against it",
                    file=sys.stderr,
                )
        text = dump_toml(tables, HEADER)
        if tomllib.loads(text) != tables:
            raise GenerationError("internal error: the written TOML does not read back identically")
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    except (GenerationError, OSError, zipfile.BadZipFile, SyntaxError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({len(text)} bytes; versions: {', '.join(tables['meta']['versions'])})")
    print("changes compared with the previous file:")
    print(summarise_changes(previous, tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
