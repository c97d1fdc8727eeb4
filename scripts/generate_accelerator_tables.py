#!/usr/bin/env python3
"""Regenerate ``transforms/data/torch_accelerator.toml`` from torch wheels on PyPI.

The portable target rewrites ``torch.cuda.X`` to device-generic PyTorch
(``torch.accelerator``, ``torch.Stream``, ``torch.amp``, ...) only where the
user's torch has the generic name.  This script records, per torch release,
which generic names exist and with which parameters, without installing or
importing any of those torches: it downloads the macOS arm64 wheel of each
release (the smallest build; the Python sources are the same on every
platform) with ``pip download --no-deps`` and reads the sources straight out
of the zip with ``ast``.

What the wheels cannot say (which generic API does the job of each
``torch.cuda`` name, and what calls do on a host without accelerator) is
curated in ``scripts/accelerator_counterparts.py``; this script checks that
curation against the wheels: every name of ``torch.cuda.__all__`` in the
reference torch needs an entry, and every counterpart must exist in some
release, from which its first version is computed.

Usage::

    .venv/bin/python scripts/generate_accelerator_tables.py                 # download + regenerate
    .venv/bin/python scripts/generate_accelerator_tables.py --offline       # cached wheels only
    .venv/bin/python scripts/generate_accelerator_tables.py --check         # exit 1 if the TOML is stale
    .venv/bin/python scripts/generate_accelerator_tables.py --cache /tmp/torchwheels --versions 2.14.1 2.15.0

Wheels are cached in ``benchmarks/.cache/wheels`` (``--cache`` to change it;
about 65-130 MB each).  A version that cannot be downloaded is skipped with a
warning.  Releases before 2.6 have no ``torch.accelerator``; they are read so
that the first version of the older generic APIs (``torch.amp``,
``torch.Stream``, ``torch.get_device_module``...) is known: one ``.0`` release
per minor line before 2.6, every release from 2.6 on.  Standard library only
(plus ``pip`` run as a subprocess).
"""

from __future__ import annotations

import argparse
import ast
import copy
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from accelerator_counterparts import (
    CUDA_COUNTERPARTS,
    DEVICE_MODULE,
    NO_ACCELERATOR,
    NO_ACCELERATOR_OBSERVED_ON,
)
from generate_api_tables import GenerationError, _list_changes, dump_toml, extract_all, version_key
from wheels import cached_wheel, download_wheel

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO_ROOT / "benchmarks" / ".cache" / "wheels"
DEFAULT_OUTPUT = REPO_ROOT / "transforms" / "data" / "torch_accelerator.toml"

DEFAULT_VERSIONS = [
    "2.0.0",
    "2.1.0",
    "2.2.0",
    "2.3.0",
    "2.4.0",
    "2.5.0",
    "2.6.0",
    "2.7.0",
    "2.7.1",
    "2.8.0",
    "2.9.0",
    "2.9.1",
    "2.10.0",
    "2.11.0",
    "2.12.0",
    "2.12.1",
    "2.13.0",
    "2.14.0",
    "2.14.1",
]
# The torch the project is tested with; its torch.cuda.__all__ is what gets mapped.
CUDA_REFERENCE = "2.13.0"

# Up to 2.11 the macOS wheels are tagged 11.0, from 2.12 on 14.0; pip takes both.
PACKAGE = "torch"
PLATFORMS = ["macosx_11_0_arm64", "macosx_14_0_arm64"]

ACCELERATOR = "torch/accelerator"
C_STUB = "torch/_C/__init__.pyi"
CUDA_PACKAGE = "torch/cuda"
CUDA_INIT = f"{CUDA_PACKAGE}/__init__.py"
CUDA_MEMORY = f"{CUDA_PACKAGE}/memory.py"

# Device-generic APIs outside torch.accelerator: where each is defined, and the
# module that must bind the name for it to be reachable (None: defined in
# torch._C, whose public names torch/__init__.py re-exports wholesale).
RELATED = {
    "torch.get_device_module": ("torch/__init__.py", "get_device_module", None),
    # Before 2.4 the stub declares Stream without a constructor: there was no generic torch.Stream(device).
    "torch.Stream": (C_STUB, "Stream.__new__", None),
    "torch.Stream.__enter__": (C_STUB, "Stream.__enter__", None),
    "torch.Event": (C_STUB, "Event.__new__", None),
    "torch.AcceleratorError": (C_STUB, "AcceleratorError", None),
    "torch.device.__enter__": (C_STUB, "device.__enter__", None),
    "torch.get_autocast_dtype": (C_STUB, "get_autocast_dtype", None),
    "torch.is_autocast_enabled": (C_STUB, "is_autocast_enabled", None),
    "torch.amp.autocast": ("torch/amp/autocast_mode.py", "autocast", "torch/amp/__init__.py"),
    "torch.amp.GradScaler": ("torch/amp/grad_scaler.py", "GradScaler", "torch/amp/__init__.py"),
    "torch.amp.custom_fwd": ("torch/amp/autocast_mode.py", "custom_fwd", "torch/amp/__init__.py"),
    "torch.amp.custom_bwd": ("torch/amp/autocast_mode.py", "custom_bwd", "torch/amp/__init__.py"),
    "torch.amp.is_autocast_available": (
        "torch/amp/autocast_mode.py",
        "is_autocast_available",
        "torch/amp/__init__.py",
    ),
    "torch.distributed.get_default_backend_for_device": (
        "torch/distributed/distributed_c10d.py",
        "get_default_backend_for_device",
        "torch/distributed/distributed_c10d.py",
    ),
}

# Modules whose whole public surface is recorded per version: torch.cpu is what
# torch.get_device_module() returns on a host without accelerator.
RECORDED_MODULES = {"cpu": "torch/cpu/__init__.py", "amp": "torch/amp/__init__.py"}  # key: torch.<key>


# --------------------------------------------------------------------------
# Static extraction
# --------------------------------------------------------------------------

_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _public(name: str) -> bool:
    return not name.startswith("_")


def bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: definitions, assignments and imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*")
    return names


def public_names(tree: ast.Module, path: str) -> set[str]:
    """``__all__`` when the module has one (it must resolve statically), else its public bindings."""
    explicit = extract_all(tree, path)
    if explicit is None:
        return {name for name in bound_names(tree) if _public(name)}
    if explicit.unresolved:
        raise GenerationError("could not resolve __all__ statically: " + "; ".join(explicit.unresolved))
    return explicit.names


def find_definitions(tree: ast.Module, qualname: str) -> list[_Definition]:
    """Top-level (or class-member, ``Class.method``) definitions of a name; several for ``@overload``."""
    body: list[ast.stmt] = tree.body
    found: list[_Definition] = []
    for part in qualname.split("."):
        found = [node for node in body if isinstance(node, _Definition) and node.name == part]
        if not found:
            return []
        body = found[0].body
    return found


def _arguments_text(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> str:
    """Parameters without annotations: what matters to a call site is names, kinds and defaults."""
    arguments = copy.deepcopy(function.args)
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
        argument.annotation = None
    for argument in (arguments.vararg, arguments.kwarg):
        if argument is not None:
            argument.annotation = None
    if method:
        # self / cls; defaults align to the right, so dropping the first parameter keeps them right.
        (arguments.posonlyargs or arguments.args).pop(0)
    return f"({ast.unparse(arguments)})"


def signature(definitions: list[_Definition]) -> str:
    """Call signature of a function or a class constructor; overloads joined by `` | ``."""
    texts = []
    for definition in definitions:
        if isinstance(definition, ast.ClassDef):
            constructor = find_definitions(ast.Module(body=definition.body, type_ignores=[]), "__init__")
            constructor = constructor or find_definitions(ast.Module(body=definition.body, type_ignores=[]), "__new__")
            texts += [_arguments_text(function, method=True) for function in constructor]
        else:
            is_method = bool(definition.args.posonlyargs or definition.args.args) and (
                (definition.args.posonlyargs or definition.args.args)[0].arg in ("self", "cls")
            )
            texts.append(_arguments_text(definition, method=is_method))
    return " | ".join(dict.fromkeys(texts))


def _deprecated_target(value: ast.expr) -> str | None:
    """``deprecated("...")(target)`` -> ``"target"``: the alias has the target's signature."""
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Call)
        and isinstance(value.func.func, ast.Name)
        and value.func.func.id == "deprecated"
        and len(value.args) == 1
        and isinstance(value.args[0], ast.Name)
    ):
        return value.args[0].id
    return None


@dataclass
class ModuleSurface:
    """Public names of one module, their signatures, and those kept only as deprecated aliases."""

    names: set[str] = field(default_factory=set)
    signatures: dict[str, str] = field(default_factory=dict)
    deprecated: set[str] = field(default_factory=set)


def module_surface(tree: ast.Module, path: str) -> ModuleSurface:
    surface = ModuleSurface(names=public_names(tree, path))
    for node in tree.body:
        if isinstance(node, _Definition) and _public(node.name):
            text = signature([node])
            if text:
                surface.signatures[node.name] = text
    for node in tree.body:
        if isinstance(node, ast.Assign) and (target := _deprecated_target(node.value)):
            for alias in node.targets:
                if isinstance(alias, ast.Name):
                    surface.deprecated.add(alias.id)
                    if target in surface.signatures:
                        surface.signatures[alias.id] = surface.signatures[target]
    return surface


@dataclass
class WheelSurface:
    """Everything recorded about one torch release."""

    table: dict
    names: set[str]
    signatures: dict[str, str]


class Wheel:
    """A torch wheel read as a zip: parsed modules are cached, missing ones are None."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.members = set(self.zip.namelist())
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, member: str) -> ast.Module | None:
        if member not in self._trees:
            self._trees[member] = ast.parse(self.zip.read(member), member) if member in self.members else None
        return self._trees[member]

    def module_path(self, package: str, name: str) -> str | None:
        for candidate in (f"{package}/{name}.py", f"{package}/{name}/__init__.py"):
            if candidate in self.members:
                return candidate
        return None

    def bound_submodules(self, package: str, tree: ast.Module) -> dict[str, list[ast.alias]]:
        """Public submodules that ``from .x import y`` / ``from . import x`` bind on the package, with what each imports.

        ``__all__`` never lists them, yet they are attributes of the package once imported.
        """
        imported: dict[str, list[ast.alias]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    imported.setdefault(node.module.split(".")[0], []).extend(node.names)
                else:
                    for alias in node.names:
                        imported.setdefault(alias.name, [])
        return {
            name: aliases
            for name, aliases in sorted(imported.items())
            if _public(name) and self.module_path(package, name) is not None
        }


def accelerator_surface(wheel: Wheel) -> tuple[dict, set[str], dict[str, str]]:
    """torch.accelerator's ``__all__``, deprecated aliases, submodules (with their names) and signatures."""
    init = f"{ACCELERATOR}/__init__.py"
    tree = wheel.tree(init)
    if tree is None:
        return {"accelerator": [], "accelerator_deprecated": [], "accelerator_submodules": {}}, set(), {}
    top = module_surface(tree, init)
    if extract_all(tree, init) is None:
        raise GenerationError(f"{wheel.path.name}: {init} defines no __all__")
    names = {"torch.accelerator"} | {f"torch.accelerator.{name}" for name in top.names}
    signatures = {f"torch.accelerator.{name}": text for name, text in top.signatures.items()}

    submodules = {}
    for submodule, imported in wheel.bound_submodules(ACCELERATOR, tree).items():
        path = wheel.module_path(ACCELERATOR, submodule)
        surface = module_surface(wheel.tree(path), path)
        submodules[submodule] = sorted(surface.names)
        names.add(f"torch.accelerator.{submodule}")
        names.update(f"torch.accelerator.{submodule}.{name}" for name in surface.names)
        for name, text in surface.signatures.items():
            signatures[f"torch.accelerator.{submodule}.{name}"] = text
        # A name re-exported at the top takes the submodule's signature.
        for alias in imported:
            if alias.name in surface.signatures:
                signatures[f"torch.accelerator.{alias.asname or alias.name}"] = surface.signatures[alias.name]
    table = {
        "accelerator": sorted(top.names),
        "accelerator_deprecated": sorted(top.deprecated),
        "accelerator_submodules": submodules,
    }
    return table, names, signatures


def related_surface(wheel: Wheel) -> tuple[list[str], dict[str, str]]:
    """Which tracked generic APIs outside torch.accelerator a release has, with their signatures."""
    present, signatures = [], {}
    for dotted, (path, qualname, binding) in RELATED.items():
        tree = wheel.tree(path)
        definitions = find_definitions(tree, qualname) if tree is not None else []
        if not definitions:
            continue
        if binding is not None:
            binding_tree = wheel.tree(binding)
            if binding_tree is None or dotted.rsplit(".", 1)[1] not in public_names(binding_tree, binding):
                continue
        present.append(dotted)
        text = signature(definitions)
        if text:
            signatures[dotted] = text
    return present, signatures


def extract_wheel(path: Path) -> WheelSurface:
    wheel = Wheel(path)
    table, names, signatures = accelerator_surface(wheel)
    for key, member in RECORDED_MODULES.items():
        tree = wheel.tree(member)
        module_names = set()
        if tree is not None:
            module_names = public_names(tree, member) | set(wheel.bound_submodules(f"torch/{key}", tree))
        table[key] = sorted(module_names)
        if tree is not None:
            names.add(f"torch.{key}")
        names.update(f"torch.{key}.{name}" for name in module_names)
    related, related_signatures = related_surface(wheel)
    table["related"] = related
    names.update(related)
    signatures.update(related_signatures)
    return WheelSurface({"wheel": path.name, **table}, names, signatures)


def extract_cuda(path: Path) -> tuple[list[str], dict[str, str]]:
    """The reference torch.cuda surface: ``__all__`` plus curated private memory names, with signatures."""
    wheel = Wheel(path)
    cuda_all = public_names(wheel.tree(CUDA_INIT), CUDA_INIT)
    memory_all = public_names(wheel.tree(CUDA_MEMORY), CUDA_MEMORY)
    if not memory_all <= cuda_all:
        # The table maps torch.cuda.memory.X through torch.cuda.X; say so if that stops being true.
        raise GenerationError(
            f"torch.cuda.memory names missing from torch.cuda.__all__: {sorted(memory_all - cuda_all)}"
        )
    private = {name for name in CUDA_COUNTERPARTS if name.startswith("memory.")}
    names = sorted(cuda_all | {name for name in private if find_definitions(wheel.tree(CUDA_MEMORY), name[7:])})
    modules = [CUDA_INIT] + sorted(
        member
        for member in wheel.members
        if member.startswith(f"{CUDA_PACKAGE}/") and member.endswith(".py") and member.count("/") == 2
    )
    signatures = {}
    for name in names:
        if name.startswith("memory."):
            candidates, qualname = [CUDA_MEMORY], name[7:]
        else:
            candidates, qualname = modules, name
        for module in candidates:
            definitions = find_definitions(wheel.tree(module), qualname)
            if definitions:
                signatures[name] = signature(definitions)
                break
    return names, signatures


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------


def _kind(target: str | None) -> str:
    if target is None:
        return "none"
    if target.startswith(DEVICE_MODULE):
        return "device_module"
    if target.startswith("torch.accelerator"):
        return "accelerator"
    return "torch"


def _lookup(target: str) -> str:
    """The dotted name a counterpart needs to exist: a device-module lookup needs get_device_module."""
    return "torch.get_device_module" if target.startswith(DEVICE_MODULE) else target


def first_version(target: str, surfaces: dict[str, set[str]], what: str) -> str:
    """First release whose surface has ``target``; it must stay in every later release."""
    lookup = _lookup(target)
    present = [version for version, names in surfaces.items() if lookup in names]
    if not present:
        raise GenerationError(f"{what}: {lookup} exists in none of the releases read")
    since = present[0]
    later = [version for version in surfaces if version_key(version) > version_key(since)]
    missing = [version for version in later if version not in present]
    if missing:
        raise GenerationError(f"{what}: {lookup} appears in {since} but is missing from {', '.join(missing)}")
    return since


def cuda_table(names: list[str], cuda_signatures: dict[str, str], surfaces: dict[str, set[str]]) -> dict:
    uncurated = sorted(set(names) - set(CUDA_COUNTERPARTS))
    stale = sorted(set(CUDA_COUNTERPARTS) - set(names))
    if uncurated or stale:
        raise GenerationError(
            "scripts/accelerator_counterparts.py is out of date with torch.cuda "
            f"(reference torch {CUDA_REFERENCE}): no entry for {uncurated or 'nothing'}; "
            f"entries for names torch.cuda lacks: {stale or 'none'}"
        )
    table = {}
    for name in names:
        entry = CUDA_COUNTERPARTS[name]
        what = f"counterpart of torch.cuda.{name}"
        table[name] = {
            "kind": _kind(entry.target),
            "counterpart": entry.target or "",
            "since": first_version(entry.target, surfaces, what) if entry.target else "",
            "fallback": entry.fallback,
            "needs_guard": entry.needs_guard,
            "cuda_signature": cuda_signatures.get(name, ""),
            "note": entry.note,
        }
        if entry.fallback:
            first_version(entry.fallback, surfaces, f"fallback of torch.cuda.{name}")
    return table


def introduced_table(surfaces: dict[str, set[str]]) -> dict[str, str]:
    introduced: dict[str, str] = {}
    for version, names in surfaces.items():
        for name in sorted(names):
            introduced.setdefault(name, version)
    return dict(sorted(introduced.items()))


def removed_table(surfaces: dict[str, set[str]]) -> dict[str, str]:
    """Names that were present once and are missing from a later release: the first release without them."""
    removed: dict[str, str] = {}
    seen: set[str] = set()
    for version, names in surfaces.items():
        for name in sorted(seen - names):
            removed.setdefault(name, version)
        seen |= names
    return dict(sorted(removed.items()))


def signature_history(signatures: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Per name, the releases where its signature changed (first appearance included)."""
    history: dict[str, dict[str, str]] = {}
    for version, by_name in signatures.items():
        for name, text in by_name.items():
            changes = history.setdefault(name, {})
            if not changes or list(changes.values())[-1] != text:
                changes[version] = text
    return dict(sorted(history.items()))


def no_accelerator_table() -> dict:
    return {
        call: {
            "cpu_build": facts.cpu_build,
            "cuda_build_without_gpu": facts.cuda_build_without_gpu,
            "note": facts.note,
        }
        for call, facts in NO_ACCELERATOR.items()
    }


HEADER = (
    "Generated by scripts/generate_accelerator_tables.py from the torch wheels on PyPI\n"
    "and scripts/accelerator_counterparts.py. Do not edit by hand."
)


def build_tables(args: argparse.Namespace) -> dict:
    args.cache.mkdir(parents=True, exist_ok=True)
    versions, surfaces, signatures, wheels = {}, {}, {}, {}
    for version in sorted(set(args.versions), key=version_key):
        wheel = cached_wheel(args.cache, PACKAGE, version)
        if wheel is None and args.offline:
            print(f"warning: skipping torch {version}: not in {args.cache} (--offline)", file=sys.stderr)
            continue
        if wheel is None:
            print(f"downloading torch {version} ...", file=sys.stderr)
            wheel = download_wheel(args.cache, PACKAGE, version, [PLATFORMS])
            if wheel is None:
                continue
        extracted = extract_wheel(wheel)
        versions[version], surfaces[version], signatures[version] = (
            extracted.table,
            extracted.names,
            extracted.signatures,
        )
        wheels[version] = wheel
    skipped = sorted(set(args.versions) - set(versions), key=version_key)
    if args.check and skipped:
        raise GenerationError(f"--check needs every release's wheel; could not read {', '.join(skipped)}")
    if CUDA_REFERENCE not in wheels:
        raise GenerationError(
            f"the reference torch {CUDA_REFERENCE} could not be read; its torch.cuda is what is mapped"
        )
    cuda_names, cuda_signatures = extract_cuda(wheels[CUDA_REFERENCE])
    ordered = list(versions)
    return {
        "meta": {
            "generated_by": "scripts/generate_accelerator_tables.py",
            "source": "torch wheels for macOS arm64 from PyPI, read with ast (the Python sources are the same "
            "on every platform)",
            "versions": ordered,
            "oldest": ordered[0],
            "newest": ordered[-1],
            "cuda_reference": CUDA_REFERENCE,
            "device_module_prefix": DEVICE_MODULE,
            "no_accelerator_observed_on": NO_ACCELERATOR_OBSERVED_ON,
        },
        "versions": versions,
        "introduced": introduced_table(surfaces),
        "removed": removed_table(surfaces),
        "signatures": signature_history(signatures),
        "cuda": cuda_table(cuda_names, cuda_signatures, surfaces),
        "no_accelerator": no_accelerator_table(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Regenerate transforms/data/torch_accelerator.toml from torch wheels "
        "(read statically; torch is never installed or imported)."
    )
    parser.add_argument(
        "--versions",
        nargs="+",
        default=DEFAULT_VERSIONS,
        metavar="V",
        help="torch versions to read (default: every release from 2.6 and one per minor line before)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"wheel cache directory (default: {DEFAULT_CACHE.relative_to(REPO_ROOT)})",
    )
    parser.add_argument("--offline", action="store_true", help="use only wheels already in the cache; never call pip")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the committed TOML differs from what the wheels say",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"TOML to write or check (default: {DEFAULT_OUTPUT.relative_to(REPO_ROOT)})",
    )
    return parser.parse_args(argv)


def _read_previous(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        print(f"warning: existing {path} is not valid TOML ({error}); not diffing against it", file=sys.stderr)
        return None


def describe_changes(old: dict | None, new: dict) -> str:
    if old is None:
        return "no previous TOML; every entry is new"
    lines = [line for key, table in new.items() for line in _list_changes(key, old.get(key, {}), table)]
    lines += [f"  {key}: removed" for key in old if key not in new]
    return "\n".join(lines) if lines else "no changes"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for version in args.versions:
            version_key(version)
        tables = build_tables(args)
        text = dump_toml(tables, HEADER)
        if tomllib.loads(text) != tables:
            raise GenerationError("internal error: the written TOML does not read back identically")
        previous = _read_previous(args.output)
        if args.check:
            current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
            if current == text:
                print(f"{args.output} matches the wheels ({', '.join(tables['meta']['versions'])})")
                return 0
            print(f"{args.output} is stale; regenerate it. Differences:", file=sys.stderr)
            print(describe_changes(previous, tables), file=sys.stderr)
            return 1
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    except (GenerationError, OSError, zipfile.BadZipFile, SyntaxError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({len(text)} bytes; versions: {', '.join(tables['meta']['versions'])})")
    print("changes compared with the previous file:")
    print(describe_changes(previous, tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
