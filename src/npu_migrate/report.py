"""Presenting a run: findings, diffs, the summary, `change_list.csv`, and the JSON document."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from npu_migrate import __version__
from npu_migrate.findings import Finding
from npu_migrate.pipeline import FileResult, Status

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

    def add(self, result: FileResult) -> None:
        self.scanned += 1
        self.parsed += result.parsed
        self.changed += result.status is Status.CHANGED
        self.failed += result.status is Status.FAILED
        for f in result.findings:
            self.findings += 1
            (self.fixes_by_rule if f.fixed else self.open_by_rule)[f.rule_id] += 1

    def lines(self, *, dry_run: bool) -> list[str]:
        verb = "would change" if dry_run else "changed"
        out = [
            f"{self.scanned} files scanned, {self.changed} {verb}, {self.failed} failed "
            f"({self.parsed} parsed; the rest had nothing to migrate)"
        ]
        if self.fixes_by_rule:
            out.append("rewrites: " + ", ".join(f"{rule} x{n}" for rule, n in sorted(self.fixes_by_rule.items())))
        if self.open_by_rule:
            out.append(
                "needs a human: " + ", ".join(f"{rule} x{n}" for rule, n in sorted(self.open_by_rule.items()))
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
        }


def format_finding(f: Finding) -> str:
    marker = "[fixed] " if f.fixed else ""
    return f"{f.location()}: {f.rule_id} {marker}{f.message}"


def write_change_list(path: Path, findings: list[Finding]) -> None:
    """`change_list.csv`: one row per rewrite (open findings are in the report, not here)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "line", "rule", "original", "replacement", "message"])
        for f in findings:
            if f.fixed:
                writer.writerow([f.path, f.line, f.rule_id, f.original, f.replacement, f.message])


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
