"""Migrating files that are not Python: launch scripts, Dockerfiles, .env and YAML files, CUDA sources.

They have no syntax tree here, so their checkers (`rule.TextChecker`) look at one line at a time, outside
comments and as whole tokens, and propose edits as character spans (`rule.TextReport`). The engine applies
the spans, honours `# npu-migrate: ignore` on a line, and reports findings exactly as for Python files.
Lines are counted as in Python files (`lines.source_lines`): a form feed is inside a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npu_migrate.engine.lines import Suppressions, source_lines
from npu_migrate.engine.sites import TextReport  # what text checkers import from here, with the line helpers
from npu_migrate.findings import Finding


@dataclass(frozen=True)
class Line:
    number: int  # 1-based
    start: int  # offset of the line in the file
    text: str  # without its newline
    code_end: int  # where a `#` comment starts (len(text) when there is none)

    @property
    def code(self) -> str:
        return self.text[: self.code_end]


def comment_start(text: str) -> int:
    """Where a shell / YAML / Dockerfile comment starts on this line: a `#` outside quotes, at the start or
    after whitespace (`a#b` is a word in shell, not a comment)."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"':
                continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1] in " \t"):
            return i
    return len(text)


def split_lines(text: str, comments: bool = True) -> list[Line]:
    lines, offset = [], 0
    for number, raw in enumerate(source_lines(text, keepends=True), start=1):
        body = raw.rstrip("\r\n")
        lines.append(Line(number, offset, body, comment_start(body) if comments else len(body)))
        offset += len(raw)
    return lines


def token(name: str, word: str = "A-Za-z0-9_") -> re.Pattern[str]:
    """`name` as a whole word: not part of MY_CUDA_VISIBLE_DEVICES_NOTE (or, with `word` including "-",
    of my-nvidia-smi-wrapper)."""
    return re.compile(rf"(?<![{word}]){re.escape(name)}(?![{word}])")


def quoted(code: str, position: int) -> bool:
    """Whether `position` of a line lies inside a quoted string."""
    quote = None
    for char in code[:position]:
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
    return quote is not None


def is_prose(code: str, start: int, end: int) -> bool:
    """A name inside quotes is text ("set CUDA_VISIBLE_DEVICES yourself") unless it is expanded
    ("${CUDA_VISIBLE_DEVICES}", "$CUDA_VISIBLE_DEVICES") or assigned ("CUDA_VISIBLE_DEVICES=0")."""
    if not quoted(code, start):
        return False
    expanded = code[max(0, start - 2) : start].endswith(("$", "${"))
    assigned = code[end : end + 1] == "="
    return not (expanded or assigned)


def apply_reports(text: str, reports: list[TextReport], display: str) -> tuple[str, list[Finding]]:
    """Apply the edits of `reports` (overlapping ones after the first are dropped) and return findings."""
    suppressions = Suppressions.scan(text)
    kept = [r for r in reports if not suppressions.covers(r.line, r.rule.id)]
    kept.sort(key=lambda r: (r.line, r.col, r.rule.id))
    out, cursor = [], 0
    for report in kept:
        edit = report.fix
        if edit is not None and edit.start >= cursor:
            out.append(text[cursor : edit.start])
            out.append(edit.replacement)
            cursor, report.applied = edit.end, True
    out.append(text[cursor:])
    new_text = "".join(out)
    changed = new_text != text
    findings = []
    for report in kept:
        edit = report.fix if report.applied else None
        original, replacement = (text[edit.start : edit.end], edit.replacement) if edit else ("", "")
        findings.append(
            report.finding(
                display, report.line, report.col, changed=changed, original=original, replacement=replacement
            )
        )
    return new_text, findings
