"""Which rewrites a crash of the migrated program comes from: the findings around the line it crashed on.

The codemod is run again, in memory, on the original file (`migrate_text`: no torch, nothing written)
to get its findings; the crash line of the migrated file is mapped back to the original with
`scoped.position_map`. Three relations are looked for, in the original file:

* at: findings on the statement that crashed (a rewrite there, or a site left for a human);
* guard: findings in the test of an `if` / `while` that encloses the statement (a flipped guard:
  `if torch.cuda.is_available()` became `torch.npu...` and now lets CUDA code run);
* value: findings on the last assignment, in the enclosing scopes, of a name that the statement or
  one of those tests reads (`HAS_GPU = torch.cuda.is_available()` rewritten, then `HAS_GPU and ...`).
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from pathlib import Path

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.scoped import position_map
from npu_migrate.files.source import SourceError, read_source
from npu_migrate.findings import Finding


@dataclass(frozen=True)
class Cause:
    rule_id: str
    line: int  # in the original file
    fixed: bool  # True: the codemod rewrote this site; False: it reported it and left it
    relation: str  # "at", "guard" or "value"
    name: str = ""  # for "value": the variable that carries the rewritten value
    message: str = ""

    def describe(self) -> str:
        done = "rewritten" if self.fixed else "reported, not rewritten"
        if self.relation == "guard":
            return f"under the guard at line {self.line} ({self.rule_id}, {done})"
        if self.relation == "value":
            return f"reads `{self.name}`, set at line {self.line} ({self.rule_id}, {done})"
        return f"{self.rule_id} at line {self.line}, {done}: {self.message}"


@dataclass
class Attribution:
    original_file: str
    original_line: int
    causes: list[Cause] = field(default_factory=list)

    @property
    def rule_ids(self) -> list[str]:
        return sorted({cause.rule_id for cause in self.causes})

    def to_dict(self) -> dict:
        data = asdict(self)
        data["rule_ids"] = self.rule_ids
        return data


def attribute(
    original_root: Path, migrated_root: Path, relative: str, line: int, torch_npu_version: str | None
) -> Attribution | None:
    """The findings behind a crash at `relative`:`line` of the migrated tree; None when the file has no
    original (new in the migrated tree) or the original cannot be read or migrated."""
    original_path, migrated_path = original_root / relative, migrated_root / relative
    try:
        original = read_source(original_path).text
        migrated = read_source(migrated_path).text
        _, findings = migrate_text(original, path=relative, torch_npu_version=torch_npu_version)
        tree = ast.parse(original)
    except (OSError, SourceError, SyntaxError, ValueError):
        return None
    original_line = position_map(original, migrated)(line, 0)[0]
    return Attribution(relative, original_line, _causes(tree, original_line, findings))


def _causes(tree: ast.Module, line: int, findings: list[Finding]) -> list[Cause]:
    chain = _enclosing(tree, line)
    if not chain:
        return []
    statement = chain[-1]
    causes: list[Cause] = []
    read_by = [_header(statement)]
    causes += _on_lines(findings, _lines(_header(statement)), "at")
    for node in chain[:-1]:
        test = getattr(node, "test", None)
        if isinstance(node, (ast.If, ast.While)) and not _contains(test, line):
            causes += _on_lines(findings, _lines(test), "guard")
            read_by.append(test)
    scopes = [tree] + [node for node in chain[:-1] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for name in sorted({n.id for part in read_by for n in ast.walk(part) if isinstance(n, ast.Name)}):
        assignment = _last_assignment(scopes, name, line)
        if assignment is not None:
            causes += _on_lines(findings, _lines(assignment), "value", name)
    unique: dict[tuple, Cause] = {}
    for cause in causes:
        unique.setdefault((cause.rule_id, cause.line, cause.relation, cause.name), cause)
    return list(unique.values())


def _contains(node: ast.AST | None, line: int) -> bool:
    return node is not None and node.lineno <= line <= (node.end_lineno or node.lineno)


def _enclosing(tree: ast.Module, line: int) -> list[ast.stmt]:
    """The statements that contain `line`, outermost first."""
    chain: list[ast.stmt] = []
    body: list[ast.stmt] = tree.body
    while (inner := next((stmt for stmt in body if _contains(stmt, line)), None)) is not None:
        chain.append(inner)
        body = list(_children(inner))
    return chain


def _children(statement: ast.stmt):
    for attr in ("body", "orelse", "finalbody"):
        yield from (s for s in getattr(statement, attr, []) if isinstance(s, ast.stmt))
    for block in (*getattr(statement, "handlers", []), *getattr(statement, "cases", [])):
        yield from block.body


def _header(statement: ast.stmt) -> ast.AST:
    """What a statement itself evaluates: a compound statement's test or iterable, a simple one whole."""
    for attr in ("test", "iter", "items", "value"):
        part = getattr(statement, attr, None)
        if isinstance(part, ast.AST) and hasattr(part, "lineno"):
            return part
    if isinstance(statement, ast.With):
        return statement.items[0].context_expr
    return statement


def _lines(node: ast.AST) -> range:
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _on_lines(findings: list[Finding], lines: range, relation: str, name: str = "") -> list[Cause]:
    return [
        Cause(f.rule_id, f.line, f.fixed, relation, name, f.message)
        for f in findings
        if f.line in lines and f.rule_id != "NPU001"  # the added `import torch_npu` guards nothing
    ]


def _last_assignment(scopes: list[ast.AST], name: str, line: int) -> ast.stmt | None:
    """The last statement before `line` that binds `name` in one of the scopes (not in nested defs)."""
    found: ast.stmt | None = None
    for scope in scopes:
        stack = list(scope.body)
        while stack:
            stmt = stack.pop()
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or stmt.lineno >= line:
                continue
            targets = []
            if isinstance(stmt, ast.Assign):
                targets = [n for t in stmt.targets for n in ast.walk(t)]
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets = [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if found is None or stmt.lineno > found.lineno:
                    found = stmt
            stack.extend(_children(stmt))
    return found
