"""What a rule reports: one finding per site, with an optional fix that `apply` may carry out."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


class Severity(str, enum.Enum):
    """What the user must do about an open finding: `error`, the code will fail on an NPU unless a human
    acts; `warning`, it may behave differently there, or a rewrite was declined and the CUDA code is still
    in place (a human checks it); `info`, nothing is required: a rewrite made, a fact worth knowing, or
    an optional fused kernel that was not used (the code runs unfused as it is)."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for info, 1 warning, 2 error: `--min-severity` shows the findings at or above one."""
        return _RANK[self]

    def at_least(self, other: Severity) -> bool:
        return self.rank >= other.rank


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}

#: The severities, weakest first (the `--min-severity` choices).
SEVERITIES = tuple(s.value for s in _RANK)


class FindingData(Mapping[str, str | int]):
    """The structured facts of a finding that code reads (which kernel, which helper), so that nothing has
    to parse its message. Read-only, hashable, and picklable (findings cross process boundaries, which
    `types.MappingProxyType` cannot)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str | int] | None = None) -> None:
        items = dict(items or {})
        for key, value in items.items():
            if not isinstance(key, str) or not isinstance(value, (str, int)):
                raise TypeError(f"finding data maps str to str or int, not {key!r}: {value!r}")
        self._items = items

    @classmethod
    def of(cls, items: Mapping[str, str | int] | None) -> FindingData:
        """`items` as finding data, without a copy when they are already."""
        if isinstance(items, cls):
            return items
        return cls(items) if items else NO_DATA

    def __getitem__(self, key: str) -> str | int:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __reduce__(self):
        return FindingData, (self._items,)

    def __repr__(self) -> str:
        return f"FindingData({self._items!r})"


NO_DATA = FindingData()


@dataclass(frozen=True)
class Finding:
    """One reported site. `fixed` is true when `apply` rewrote it (or would, under --diff/--check).
    `data` holds the facts code needs to read about it (`--format json` writes it as `data`, SARIF as the
    result's `properties`); the message is for people."""

    rule_id: str
    path: str
    line: int
    col: int
    message: str
    severity: Severity
    fixed: bool = False
    original: str = ""
    replacement: str = ""
    data: FindingData = field(default=NO_DATA)

    def __post_init__(self) -> None:
        if not isinstance(self.data, FindingData):
            object.__setattr__(self, "data", FindingData.of(self.data))

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
            "data": dict(self.data),
        }
