"""Presenting a run: findings, diffs, the summary, `change_list.csv`, and the JSON document."""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from npu_migrate import __version__
from npu_migrate.engine.pipeline import FileResult, Status
from npu_migrate.findings import Finding, Severity

JSON_SCHEMA_VERSION = 1


@dataclass
class Summary:
    scanned: int = 0
    parsed: int = 0
    changed: int = 0
    failed: int = 0
    findings: int = 0
    fixes_by_rule: Counter = field(default_factory=Counter)
    open_by_rule: Counter = field(default_factory=Counter)
    open_errors: int = 0  # open findings of severity "error": code that will fail on NPU as it is
    open_warnings: int = 0
    #: Open findings of severity info, by rule: nothing is required (an optional fused kernel not used,
    #: a fact worth knowing); `open_by_rule` counts them too.
    notes_by_rule: Counter = field(default_factory=Counter)

    def add(self, result: FileResult) -> None:
        self.scanned += 1
        self.parsed += result.parsed
        self.changed += result.status is Status.CHANGED
        self.failed += result.status is Status.FAILED
        for f in result.findings:
            self.findings += 1
            (self.fixes_by_rule if f.fixed else self.open_by_rule)[f.rule_id] += 1
            self.open_errors += not f.fixed and f.severity is Severity.ERROR
            self.open_warnings += not f.fixed and f.severity is Severity.WARNING
            if not f.fixed and f.severity is Severity.INFO:
                self.notes_by_rule[f.rule_id] += 1

    def fails(self, fail_on: str, *, check: bool) -> bool:
        """Whether the run exits 1 under the `--fail-on` threshold (see `config.FAIL_ON`): with --check a file
        that would change always fails; open findings fail only at or above the threshold."""
        if check and self.changed:
            return True
        if fail_on == "error":
            return self.open_errors > 0
        if fail_on == "warning":
            return self.open_errors + self.open_warnings > 0
        return False

    @property
    def open_notes(self) -> int:
        return sum(self.notes_by_rule.values())

    def lines(self, *, dry_run: bool, min_severity: Severity = Severity.INFO) -> list[str]:
        """The summary. `min_severity`: the open findings below it were not printed, which it says with
        the option that shows them."""
        verb = "would change" if dry_run else "changed"
        out = [
            f"{_count(self.scanned, 'file')} scanned, {self.changed} {verb}, {self.failed} failed "
            f"({self.parsed} parsed; the rest had nothing to migrate)"
        ]
        if self.fixes_by_rule:
            out.append("rewrites: " + ", ".join(f"{rule} x{n}" for rule, n in sorted(self.fixes_by_rule.items())))
        human = self.open_by_rule - self.notes_by_rule
        if human:
            counts = f"{_count(self.open_errors, 'error')}, {_count(self.open_warnings, 'warning')}"
            out.append(f"needs a human ({counts}): " + ", ".join(f"{r} x{n}" for r, n in sorted(human.items())))
        if self.notes_by_rule:
            hidden = not Severity.INFO.at_least(min_severity)
            why = "; not shown, --min-severity info lists them" if hidden else ""
            out.append(
                f"notes, nothing required ({_count(self.open_notes, 'info finding')}: optional fused kernels not "
                f"used, facts worth knowing{why}): "
                + ", ".join(f"{r} x{n}" for r, n in sorted(self.notes_by_rule.items()))
            )
        return out

    def to_dict(self) -> dict:
        return {
            "files_scanned": self.scanned,
            "files_parsed": self.parsed,
            "files_changed": self.changed,
            "files_failed": self.failed,
            "findings": self.findings,
            "fixes_by_rule": dict(sorted(self.fixes_by_rule.items())),
            "open_by_rule": dict(sorted(self.open_by_rule.items())),
            "open_by_severity": {
                "error": self.open_errors,
                "warning": self.open_warnings,
                "info": self.open_notes,
            },
        }


def _count(n: int, noun: str) -> str:
    """`1 file`, `2 files`: the summary reads as a sentence."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def statistics_lines(summary: Summary, *, written: bool = True) -> list[str]:
    """`--statistics`: one line per rule with its count, instead of one line per finding. A rewrite is
    `[fixed]` where the run wrote it, `[fixable]` where it did not (`--diff`, `--check`), as in
    `format_finding`."""
    from npu_migrate.engine.registry import rule

    rows = [(n, rule_id, "fixed" if written else "fixable") for rule_id, n in summary.fixes_by_rule.items()]
    rows += [(n, rule_id, "open") for rule_id, n in summary.open_by_rule.items()]
    rows.sort(key=lambda row: (-row[0], row[1], row[2]))
    width = len(str(rows[0][0])) if rows else 1
    return [
        f"{n:>{width}}  {rule_id}  [{state}]{' ' * (8 - len(state))}{rule(rule_id).summary}"
        for n, rule_id, state in rows
    ]


def format_finding(f: Finding, *, written: bool = True) -> str:
    """One finding as a line. A rewrite is `[fixed]` where the run wrote it, `[fixable]` where it only
    reports it (`analyze`, `--diff`): a reader must not believe a file changed that did not."""
    marker = ("[fixed] " if written else "[fixable] ") if f.fixed else ""
    return f"{f.location()}: {f.rule_id} {marker}{f.message}"


#: Longest `original` / `replacement` cell of change_list.csv: a fused rewrite replaces whole functions,
#: which the migrated file and the diff show; the spreadsheet names the change.
CHANGE_CELL = 120


def _change_cell(code: str) -> str:
    lines = code.strip().splitlines()
    if not lines:
        return ""
    first = " ".join(lines[0].split())
    if len(lines) == 1 and len(first) <= CHANGE_CELL:
        return first
    return f"{first[: CHANGE_CELL - 30]} ... ({len(lines)} lines; see the migrated file)"


def write_change_list(path: Path, findings: list[Finding], destinations: Mapping[str, Path]) -> None:
    """`change_list.csv` in the output tree: a row per site, what `apply` rewrote and what a person must
    still do, with paths relative to the output tree (`destinations`: each finding's path -> its copy)."""
    root = path.parent
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "line", "rule", "status", "original", "replacement", "message"])
        for f in sorted(findings, key=lambda f: (not f.fixed, f.path, f.line, f.col, f.rule_id)):
            destination = destinations.get(f.path)
            file = destination.relative_to(root).as_posix() if destination is not None else f.path
            status = "rewritten" if f.fixed else "to do by hand"
            writer.writerow(
                [file, f.line, f.rule_id, status, _change_cell(f.original), _change_cell(f.replacement), f.message]
            )


def write_json(stream: TextIO, command: str, results: list[FileResult], summary: Summary) -> None:
    document = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": {"name": "npu-migrate", "version": __version__},
        "command": command,
        "summary": summary.to_dict(),
        "files": [
            {
                "path": r.display,
                "status": r.status.value,
                "error": r.error or None,
                "diff": r.diff or None,
                "findings": [f.to_dict() for f in r.findings],
            }
            for r in results
            if r.status is not Status.UNCHANGED or r.findings
        ],
    }
    json.dump(document, stream, indent=2)
    stream.write("\n")


_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def sarif_document(findings: list[Finding]) -> dict:
    """SARIF 2.1.0, so code-scanning UIs show the findings inline; its rules are the registry's, `apply`'s
    and `analyze`'s alike."""
    from npu_migrate.engine.registry import all_rules

    rules = all_rules()
    index = {rule.id: i for i, rule in enumerate(rules)}
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "npu-migrate",
                        "version": __version__,
                        "rules": [
                            {
                                "id": rule.id,
                                "name": rule.name,
                                "shortDescription": {"text": rule.summary},
                                "fullDescription": {"text": rule.documentation},
                                "defaultConfiguration": {"level": _SARIF_LEVEL[rule.severity.value]},
                                # SARIF's property bag: `tags` is the standard key code-scanning UIs filter on.
                                "properties": {
                                    "tags": sorted({rule.family, *rule.tags}),
                                    "family": rule.family,
                                    "fixSafety": rule.fix_safety.value,
                                },
                            }
                            for rule in rules
                        ],
                    }
                },
                "results": [
                    {
                        "ruleId": f.rule_id,
                        "ruleIndex": index[f.rule_id],
                        "level": "note" if f.fixed else _SARIF_LEVEL[f.severity.value],
                        "message": {"text": f.message},
                        "locations": [
                            {
                                "physicalLocation": {
                                    "artifactLocation": {"uri": f.path},
                                    "region": {"startLine": f.line, "startColumn": f.col},
                                }
                            }
                        ],
                        # SARIF's property bag: the finding's data (`Finding.data`), when it has any.
                        **({"properties": dict(f.data)} if f.data else {}),
                    }
                    for f in findings
                    if f.rule_id in index
                ],
            }
        ],
    }


def github_annotation(f: Finding) -> str:
    """A GitHub Actions workflow command: the finding shows on the pull request's diff."""

    def escape(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    level = "notice" if f.fixed else _GITHUB_LEVEL[f.severity.value]
    title = f"{f.rule_id}{' (fixable)' if f.fixed else ''}"
    return f"::{level} file={f.path},line={f.line},col={f.col},title={title}::{escape(f.message)}"


def colour_diff(diff: str) -> str:
    import typer

    out = []
    for line in diff.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            out.append(typer.style(line, bold=True))
        elif line.startswith("+"):
            out.append(typer.style(line, fg="green"))
        elif line.startswith("-"):
            out.append(typer.style(line, fg="red"))
        elif line.startswith("@@"):
            out.append(typer.style(line, fg="cyan"))
        else:
            out.append(line)
    return "".join(out)
