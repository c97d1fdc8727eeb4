"""`apply --interactive`: review the migration hunk by hunk, like `git add -p`.

Each file is migrated in memory; its diff is cut into the hunks `unified_diff` prints, and each accepted
hunk's lines replace the original's, so the result is exactly the migrated text restricted to the accepted
hunks (all accepted: what `apply` writes; none: the file as it was). Nothing is written until the review
ends; then every file is checked to still hold what was read, and only if all do are they written: an
interrupted review (Ctrl-C, end of input) or a file edited meanwhile writes nothing.

Hunks are not always independent: one may add a name another uses (`import torch_npu`, which every
`torch.npu` / `.npu()` / `"npu"` rewrite needs; a helper such as `_npu_sdpa` or its import). Accepting a
hunk accepts what it needs, and says so; a needed hunk declined earlier is brought back by accepting one
that needs it. So no answer writes a file that fails with a NameError or without torch_npu.

A package's helper module is written with the files whose accepted hunks import from it, holding what
they import: no file is written that imports helpers not written.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from npu_migrate.engine import registry
from npu_migrate.engine.pipeline import _GIT_LINE, Job, Plan, helper_imports, migrate_file, unified_diff, validate
from npu_migrate.files import kinds
from npu_migrate.files.source import SourceError, SourceFile, atomic_write, read_source
from npu_migrate.findings import Finding
from npu_migrate.output.helper_module import ModuleChange, changes
from npu_migrate.program.api import NpuApi
from npu_migrate.program.packages import collect
from npu_migrate.transforms.fused import HELPER_NAMES
from npu_migrate.transforms.fused.helpers import defined_names

HELP = """y - apply this hunk
n - do not apply this hunk
a - apply this hunk and all later hunks in the file
d - do not apply this hunk or any of the later hunks in the file
q - quit; do not apply this hunk or any of the remaining ones (the hunks accepted so far are written)
? - print help
A hunk that uses a name another hunk adds (`import torch_npu`, a helper) brings that hunk with it.
"""


@dataclass
class Hunk:
    opcodes: list[tuple[str, int, int, int, int]]
    text: str  # as `unified_diff` prints it, from its "@@" line
    findings: list[Finding] = field(default_factory=list)  # those on the original lines it replaces
    needs: dict[int, str] = field(default_factory=dict)  # hunk index -> the name it adds that this hunk uses


@dataclass
class Review:
    """One file under review: what was read, the migrated text, and its hunks."""

    job: Job
    source: SourceFile
    kind: str
    migrated: str
    hunks: list[Hunk]
    accepted: set[int] = field(default_factory=set)

    def accept(self, index: int, say: Callable[[str], None]) -> None:
        """Accept hunk `index` and, transitively, the hunks it needs; tell the user of each one brought in."""
        pending = [index]
        while pending:
            current = pending.pop()
            if current in self.accepted:
                continue
            self.accepted.add(current)
            for needed, name in sorted(self.hunks[current].needs.items()):
                if needed not in self.accepted:
                    say(
                        f"# hunk {needed + 1}/{len(self.hunks)} applied too: it adds `{name}`, which hunk "
                        f"{current + 1} uses\n"
                    )
                    pending.append(needed)

    def result(self) -> str:
        return restrict(self.source.text, self.migrated, [self.hunks[i] for i in sorted(self.accepted)])


class Quit(Exception):
    """The reviewer answered q: stop asking, write what was accepted."""


def split_hunks(display: str, before: str, after: str, findings: Iterable[Finding]) -> list[Hunk]:
    a, b = _GIT_LINE.findall(before), _GIT_LINE.findall(after)
    # The same matcher and context as difflib.unified_diff, so the groups are the printed hunks, in order.
    groups = list(difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(3))
    printed = unified_diff(display, before, after).splitlines(keepends=True)
    starts = [i for i, line in enumerate(printed) if line.startswith("@@ ")]
    texts = ["".join(printed[s:e]) for s, e in zip(starts, [*starts[1:], len(printed)])]
    assert len(texts) == len(groups), "one printed hunk per group of opcodes"
    hunks = []
    for group, text in zip(groups, texts):
        first, last = group[0][1] + 1, group[-1][2]  # 1-based original lines the hunk covers
        near = [f for f in findings if first <= f.line <= max(first, last)]
        hunks.append(Hunk(group, text, near))
    return hunks


def restrict(before: str, after: str, accepted: list[Hunk]) -> str:
    """`before` with the changed lines of the `accepted` hunks taken from `after`."""
    a, b = _GIT_LINE.findall(before), _GIT_LINE.findall(after)
    out: list[str] = []
    position = 0
    for hunk in sorted(accepted, key=lambda h: h.opcodes[0][1]):
        for tag, i1, i2, j1, j2 in hunk.opcodes:
            if tag == "equal":
                continue
            out.extend(a[position:i1])
            out.extend(b[j1:j2])
            position = i2
    out.extend(a[position:])
    return "".join(out)


def prepare(job: Job, plan: Plan, api: NpuApi) -> Review | None:
    """The file migrated in memory, cut into hunks; None when nothing would change. SourceError on bad input."""
    source = read_source(job.path)
    kind = kinds.kind_of(job.path) or kinds.PYTHON
    helper_module = job.helper_module if kind == kinds.PYTHON else None
    migrated, findings, _ = migrate_file(source, job.display, plan, api, kind, job.ignore, helper_module, job.path)
    if migrated == source.text:
        return None
    validate(migrated, job.display, kind)
    hunks = split_hunks(job.display, source.text, migrated, findings)
    if kind == kinds.PYTHON:
        link(hunks, source.text, migrated)
    return Review(job, source, kind, migrated, hunks)


#: What a rewrite that needs torch_npu (`Rule.needs_torch_npu`, the rule NPU001 follows) uses.
TORCH_NPU = "torch_npu"


def link(hunks: list[Hunk], before: str, after: str) -> None:
    """Fill each hunk's `needs`: the hunks adding a module-level name (absent from `before`) that its new
    lines use, and the hunk adding `import torch_npu` for a hunk whose fixes need it."""
    try:
        old, new = ast.parse(before), ast.parse(after)
    except (SyntaxError, ValueError):
        return  # validate() has parsed `after`; an original ast cannot read has no names to lose
    owner: dict[int, int] = {}  # 1-based line of `after` -> the hunk that writes it
    for index, hunk in enumerate(hunks):
        for tag, _, _, j1, j2 in hunk.opcodes:
            if tag != "equal":
                owner.update(dict.fromkeys(range(j1 + 1, j2 + 1), index))
    existing = {name for name, _ in _module_bindings(old)}
    adds = {name: owner[line] for name, line in _module_bindings(new) if name not in existing and line in owner}
    for index, hunk in enumerate(hunks):
        used = {
            node.id: node.lineno
            for node in ast.walk(new)
            if isinstance(node, ast.Name) and owner.get(node.lineno) == index
        }
        if any(f.fixed and registry.rule(f.rule_id).needs_torch_npu for f in hunk.findings):
            used[TORCH_NPU] = 0
        for name in used:
            adder = adds.get(name)
            if adder is not None and adder != index:
                hunk.needs.setdefault(adder, name)


def _module_bindings(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """The names bound at module level (also in module-level `if` / `try` blocks), with their lines."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield (alias.asname or alias.name.split(".")[0]), node.lineno
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        yield name.id, node.lineno
        elif isinstance(node, (ast.If, ast.Try, ast.TryStar, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, block, ()))
        elif isinstance(node, ast.ExceptHandler):
            pending.extend(node.body)


def ask(review: Review, ask_line: Callable[[str], str], say: Callable[[str], None]) -> None:
    """Ask about each hunk of one file; fills `review.accepted`. Raises Quit on q, EOFError/KeyboardInterrupt
    when the input ends or the user interrupts."""
    total = len(review.hunks)
    index = 0
    say(f"--- a/{review.job.display}\n+++ b/{review.job.display}\n")
    while index < total:
        hunk = review.hunks[index]
        for finding in hunk.findings:
            say(f"# {finding.rule_id}{' [fixed]' if finding.fixed else ''} {finding.message}\n")
        say(hunk.text)
        if index in review.accepted:
            say(f"({index + 1}/{total}) applied: a hunk accepted before needs it\n")
            index += 1
            continue
        for needed, name in sorted(hunk.needs.items()):
            if needed not in review.accepted:
                say(f"# needs hunk {needed + 1}/{total}, which adds `{name}`: applying this hunk applies it too\n")
        answer = ask_line(f"({index + 1}/{total}) Apply this hunk to {review.job.display} [y,n,a,d,q,?]? ")
        answer = answer.strip().lower()[:1]
        if answer == "y":
            review.accept(index, say)
        elif answer == "a":
            for later in range(index, total):
                review.accept(later, say)
            return
        elif answer == "d":
            return
        elif answer == "q":
            raise Quit
        elif answer != "n":
            say(HELP)
            continue
        index += 1


def _unbound_helpers(tree: ast.Module) -> list[str]:
    """The fused-op helpers `tree` calls without defining or importing them (their hunk was declined)."""
    helpers = set(HELPER_NAMES.values())
    bound = defined_names(tree) | {
        alias.asname or alias.name for stmt in tree.body if isinstance(stmt, ast.ImportFrom) for alias in stmt.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in helpers}
    return sorted(used - bound)


def helper_module_changes(reviews: list[Review]) -> list[ModuleChange]:
    """The packages' helper modules as the reviewed files, restricted to their accepted hunks, need them."""
    imports: dict[Path, set[str]] = {}
    for review in reviews:
        module = review.job.helper_module if review.kind == kinds.PYTHON else None
        collect(imports, review.job.path, *helper_imports(review.result(), None, module))
    return changes(imports)


def write_all(reviews: list[Review], modules: list[ModuleChange] | None = None) -> tuple[list[tuple[str, str]], bool]:
    """Write every reviewed file whose result differs from what was read, and the helper `modules` they
    import (by default, `helper_module_changes(reviews)`), all or none: each is first checked to still hold
    the bytes read (and that its result parses); returns the (file, reason) errors, and whether any file
    was written (only a write failing midway leaves some written)."""
    errors: list[tuple[str, str]] = []
    ready: list[tuple[Path, bytes, bytes | None]] = []
    for review in reviews:
        text = review.result()
        if text == review.source.text:
            continue
        try:
            tree = validate(text, review.job.display, review.kind)
        except SourceError as exc:
            errors.append((review.job.display, f"the accepted hunks alone do not parse ({exc}); choose again"))
            continue
        unbound = _unbound_helpers(tree) if tree is not None else []
        if unbound:
            names = ", ".join(f"`{name}`" for name in unbound)
            reason = (
                f"the accepted hunks call the fused-op helpers {names} but not the hunk that adds them; choose again"
            )
            errors.append((review.job.display, reason))
            continue
        try:
            current = review.job.path.read_bytes()
        except OSError as exc:
            errors.append((review.job.display, f"cannot re-read before writing: {exc.strerror or exc}"))
            continue
        if current != review.source.raw:
            errors.append((review.job.display, "changed on disk during the review; not overwritten"))
            continue
        ready.append((review.job.path, review.source.encode(text), review.source.raw))
    for module in helper_module_changes(reviews) if modules is None else modules:
        if module.error or (module.before is None and module.path.exists()):
            errors.append((str(module.path), module.error or "appeared during the review; not overwritten"))
        else:
            ready.append((module.path, module.after.encode(module.encoding), module.raw))
    if errors:
        return errors, False
    written = False
    for path, data, expected in ready:
        try:
            atomic_write(path, data, expected=expected)
        except SourceError as exc:
            errors.append((str(path), str(exc)))
            break
        written = True
    return errors, written
