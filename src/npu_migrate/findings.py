"""What a rule reports: one finding per site, with an optional fix that `apply` may carry out."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(str, enum.Enum):
    ERROR = "error"  # will fail on NPU unless a human acts
    WARNING = "warning"  # may behave differently on NPU
    INFO = "info"  # rewritten, or worth knowing


@dataclass(frozen=True)
class Finding:
    """One reported site. `fixed` is true when `apply` rewrote it (or would, under --diff/--check)."""

    rule_id: str
    path: str
    line: int
    col: int
    message: str
    severity: Severity
    fixed: bool = False
    original: str = ""
    replacement: str = ""

    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"

    def to_dict(self) -> dict:
        return {
            "rule": self.rule_id,
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "severity": self.severity.value,
            "message": self.message,
            "fixed": self.fixed,
            "original": self.original,
            "replacement": self.replacement,
        }
