"""The fused-op helper module of a package (or a script folder): which files import it, where it goes,
what it must hold.

A migrated file inside a package imports the helpers its fused branches call from one module at the top
of the package (`from .._npu_fused import _is_npu, _npu_rms_norm`) instead of carrying its own copy; a
file of no package (a script, a notebook, a namespace package without `__init__.py`) keeps them inline,
unless its folder's own imports prove the folder is on sys.path (`packages.sibling_modules`): then the
module sits beside it and is imported by its top-level name (`from _npu_fused import ...`).
The workers only write the import (`Job.helper_module`) and say which names each file imports
(`FileResult.helper_imports`); the module itself is produced once, by the driver, after every file is
done, as the union of what the package's files import and what the module already holds: it only ever
grows, and what is in it (a reviewer's edits too) stays as it is. A helper in it that differs from what
this version writes is reported when a run reads the module itself (`FusedOpsChecker`, as for any file
with helpers); deleted, it is written again.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from npu_migrate.engine.pipeline import FileResult, Mode, Plan, Status, unified_diff, write_output
from npu_migrate.files.source import SourceError, atomic_write, read_source
from npu_migrate.program.packages import helper_module
from npu_migrate.transforms.fused import HELPER_NAMES, templates_defining
from npu_migrate.transforms.fused.helpers import defined_names, module_text
from npu_migrate.transforms.optimizers import HELPER as OPTIMIZER_HELPER
from npu_migrate.transforms.optimizers import HELPER_TEMPLATE as OPTIMIZER_TEMPLATE

#: Helpers of rules other than the fused ones that go to the helper module where the file's fused helpers
#: do, by name -> template.
OTHER_HELPERS = {OPTIMIZER_HELPER: OPTIMIZER_TEMPLATE}


@dataclass(frozen=True)
class ModuleChange:
    """A helper module that must be written (`before` is None when it does not exist yet), or `error`."""

    path: Path
    before: str | None
    after: str
    raw: bytes | None = None  # what was read, to check it is still there when writing
    encoding: str = "utf-8"
    error: str = ""


def _templates(names: Iterable[str]) -> list[str]:
    """The templates defining `names`: the fused helpers (with the prelude and what they call), then the
    other rules' helpers a module holds (NPU411's optimizer factory), which need no prelude."""
    names = set(names)
    fused = names - OTHER_HELPERS.keys()
    return [
        *(templates_defining(fused) if fused else []),
        *sorted(OTHER_HELPERS[n] for n in names & OTHER_HELPERS.keys()),
    ]


def _defines(template: str) -> str:
    return HELPER_NAMES.get(template) or next(n for n, t in OTHER_HELPERS.items() if t == template)


def changes(imports: Mapping[Path, Iterable[str]]) -> list[ModuleChange]:
    """For each helper module file -> the names files import from it: the module as it must be, where that
    differs from what is on disk."""
    found = []
    for path, names in sorted(imports.items()):
        templates = _templates(names)
        if not path.exists():
            # A folder that is no package holds a script folder's sibling module (`packages.sibling_modules`).
            folder = helper_module(path) is None
            found.append(ModuleChange(path, None, module_text(None, templates, folder=folder)))
            continue
        try:
            source = read_source(path)
            tree = ast.parse(source.text)
        except (SourceError, SyntaxError, ValueError) as exc:
            reason = f"cannot add the fused-op helpers the files beside it import to it: {exc}"
            found.append(ModuleChange(path, "", "", error=reason))
            continue
        defined = defined_names(tree)
        missing = [t for t in templates if _defines(t) not in defined]
        if missing:
            after = module_text(source.text, missing)
            found.append(ModuleChange(path, source.text, after, source.raw, source.encoding))
    return found


def write(change: ModuleChange, plan: Plan, display: str, destination: Path | None) -> FileResult:
    """Carry out `change` as `plan.mode` says (in place, into the --output tree at `destination`, or only
    as a diff): a result like a migrated file's, so that --diff, --check and the summary count it."""
    if change.error:
        return FileResult(display, Status.FAILED, error=change.error)
    diff = unified_diff(display, change.before or "", change.after, new_file=change.before is None)
    data = change.after.encode(change.encoding)
    try:
        if plan.mode is Mode.IN_PLACE:
            if change.before is None and change.path.exists():
                raise SourceError("appeared while npu-migrate was running; not overwritten")
            atomic_write(change.path, data, expected=change.raw)
        elif plan.mode is Mode.OUTPUT and destination is not None:
            write_output(destination, data, plan.output_root)
    except SourceError as exc:
        return FileResult(display, Status.FAILED, error=f"{exc} (the migrated files beside it import it)")
    return FileResult(display, Status.CHANGED, diff=diff, parsed=True)


def written(
    imports: Mapping[Path, Iterable[str]],
    plan: Plan,
    display: Callable[[Path], str],
    destination: Callable[[Path], Path | None],
) -> list[FileResult]:
    """Every helper module that `imports` needs changed, written as `plan` says."""
    return [write(change, plan, display(change.path), destination(change.path)) for change in changes(imports)]
