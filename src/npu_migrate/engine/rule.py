"""The rule contract: what a rule is, for the user and for the engine.

A `Rule` is a declaration: a stable id (`NPU101`), a name, a family, tags, a severity, and its user
documentation in one fixed shape (what it does, why, an example, how far its fix can be trusted), as ruff
documents its rules. `npu-migrate rules NPU101` prints it, and the example runs as a test. The checkers
that find a rule's sites are in `npu_migrate.engine.checkers`; what they report, in `npu_migrate.engine.sites`.
"""

from __future__ import annotations

import enum
import inspect
import textwrap
from dataclasses import dataclass

from npu_migrate.findings import Severity
from npu_migrate.program.api import TARGETS

#: `Rule.targets` of a rule whose meaning is the same in every target.
EVERY_TARGET = frozenset(TARGETS)


class FixSafety(str, enum.Enum):
    """How far a rule's rewrite can be trusted, graded as ruff grades fixes (safe / unsafe / display-only)."""

    SAFE = "safe"  # the migrated code does on the NPU what the original did on the GPU
    NEEDS_REVIEW = "needs review"  # a correct port that changes something a user should look at (`Rule.review`)
    REPORT_ONLY = "report only"  # never rewrites: the finding says what to do

    @property
    def meaning(self) -> str:
        return _SAFETY_MEANING[self]


_SAFETY_MEANING = {
    FixSafety.SAFE: "The rewritten code does on the NPU what the original did on the GPU.",
    FixSafety.NEEDS_REVIEW: "The rewrite is a correct port, but it changes something you should look at:",
    FixSafety.REPORT_ONLY: "The code is left as it is; the finding says what to do.",
}


def _code(text: str) -> str:
    """A code block written indented inside a declaration, as the file it stands for."""
    return textwrap.dedent(text).strip("\n") + "\n" if text.strip() else ""


@dataclass(frozen=True)
class Example:
    """Code a rule acts on. `tests/test_rule_docs.py` runs it, so the documentation cannot drift from the code.

    A rewrite rule's `before` becomes `after` with only the rule (and NPU001, where the rule needs
    `import torch_npu`) selected, the fused-op helpers it adds folded into one line
    (`npu_migrate.output.rule_examples`); a report-only rule leaves `before` as it is (`after` None)
    and reports a finding whose message contains `reports`. Analysis rules (tag "analysis") are checked on
    `npu-migrate analyze --mode all` of `before`.
    """

    before: str
    after: str | None = None
    reports: str = ""
    #: The file's name, which decides its kind: `train.sh`, `Dockerfile`, `kernel.cu`.
    path: str = "example.py"
    #: (path, text) of the files of a library `before` calls, which `analyze --env-path LIB` reads.
    library: tuple[tuple[str, str], ...] = ()
    #: Other rules that must run too for this one to act (NPU001 adds its import after their rewrites).
    with_rules: tuple[str, ...] = ()
    #: The torch_npu version the example targets, where the rule acts only for some (None: the default).
    torch_npu_version: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "before", _code(self.before))
        if self.after is not None:
            object.__setattr__(self, "after", _code(self.after))
        object.__setattr__(self, "library", tuple((path, _code(text)) for path, text in self.library))


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    #: The group the rule belongs to: the `transforms` module of an `apply` rule ("device", "fused"), the
    #: `analyze` mode of an analysis rule ("model"). `rules` lists it and reports count findings by it.
    family: str
    summary: str
    #: What the rule does: what it rewrites or reports, and what it declines.
    what: str
    #: Why: what goes wrong on an NPU without it.
    why: str
    example: Example
    fix_safety: FixSafety
    #: What to look at after the rewrite; required for `FixSafety.NEEDS_REVIEW`.
    review: str = ""
    severity: Severity = Severity.INFO
    #: Properties callers select rules by (`registry.rules_tagged`); `registry.TAGS` lists them.
    tags: frozenset[str] = frozenset()
    #: Code the rule must leave alone and not report (written like `Example.before`, same file name).
    valid: tuple[str, ...] = ()
    #: Whether the rewritten code needs torch_npu imported unconditionally (rule NPU001). False for the
    #: fused branches, which reach torch_npu only through their guarded prelude and must keep running
    #: where torch_npu is absent.
    needs_torch_npu: bool = True
    #: The `apply --target`s the rule acts in (`api.TARGETS`): "npu" only where its rewrite or advice is the
    #: NPU's own; the portable target's spelling is in the same checker, decided by `api.target`.
    targets: frozenset[str] = frozenset({"npu"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "valid", tuple(_code(text) for text in self.valid))

    @property
    def fixable(self) -> bool:
        return self.fix_safety is not FixSafety.REPORT_ONLY

    @property
    def documentation(self) -> str:
        """The documentation in its one shape: what it does, why, the example, fix safety."""
        example = self.example
        parts = ["What it does:", _indent(inspect.cleandoc(self.what)), "", "Why:", _indent(inspect.cleandoc(self.why))]
        also = f", with {', '.join(example.with_rules)}" if example.with_rules else ""
        also += f", --torch-npu-version {example.torch_npu_version}" if example.torch_npu_version else ""
        parts += ["", f"Example ({example.path}{also}):"]
        for path, text in example.library:
            parts += [f"  The library (given to `analyze --env-path`), {path}:", _indent(text, 4)]
        if example.after is not None:
            parts += ["  Before:", _indent(example.before, 4), "  After:", _indent(example.after, 4)]
        else:
            parts += ["  Left as it is and reported:", _indent(example.before, 4)]
            parts += [f"  Finding: ...{example.reports}..."]
        if self.valid:
            parts += ["", "Left alone:"] + [_indent(text, 4) for text in self.valid]
        parts += ["", f"Targets: {', '.join(sorted(self.targets))}."]
        parts += ["", f"Fix safety: {self.fix_safety.value}. {self.fix_safety.meaning}"]
        if self.review:
            parts.append(_indent(inspect.cleandoc(self.review)))
        return "\n".join(parts)


def _indent(text: str, by: int = 2) -> str:
    return textwrap.indent(text.rstrip("\n"), " " * by, lambda line: bool(line.strip()))
