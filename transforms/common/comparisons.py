"""Comparisons with a literal that migration changes (`x.device.type == "cuda"`, `backend in ("gloo", "nccl")`).

After migration the compared value names the NPU side ("npu", "hccl"), so the comparison would silently turn
False. Where the other operand visibly is what the literal names (its code mentions a device, a backend),
the literal is rewritten; anywhere else it may be an unrelated string, and the comparison is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import Rule
from npu_migrate.findings import Severity

_EQUALITY = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)


@dataclass(frozen=True)
class LiteralComparisons:
    """What one rule rewrites in comparisons; `check` is the checker's `visit_Comparison`."""

    rule: Rule
    #: The literals to rewrite on one side of a comparison (several in a tuple, list or set), else [].
    literals: Callable[[cst.BaseExpression], list[cst.CSTNode]]
    #: Whether the code of the other side visibly is what the literals name.
    visibly: Callable[[str], bool]
    fix: Callable[[cst.CSTNode], cst.CSTNode]
    #: The message of a rewrite.
    rewritten: str
    #: The message of a comparison reported for review; `{other}` is the other side's code.
    unsure: str
    #: The rewrite flips a test of CUDA into a test of the NPU (`npu_migrate.program.guards`).
    guard: bool = False

    def check(self, checker: Checker, node: cst.Comparison, leave: Callable[[str], str | None] | None = None) -> None:
        """Report the comparison's literals; `leave(other)`, when it gives a reason, leaves them as they are
        with that reason (an info finding)."""
        operands = [node.left, *(target.comparator for target in node.comparisons)]
        for index, target in enumerate(node.comparisons):
            if not isinstance(target.operator, _EQUALITY):
                continue
            left, right = operands[index], operands[index + 1]
            for literal_side, other in ((left, right), (right, left)):
                literals = self.literals(literal_side)
                if not literals:
                    continue
                other_code = checker.ctx.code(other)
                reason = leave(other_code) if leave is not None else None
                for literal in literals:
                    if reason is not None:
                        checker.report(self.rule, literal, reason, severity=Severity.INFO)
                    elif self.visibly(other_code):
                        checker.report(self.rule, literal, self.rewritten, fix=self.fix, guard=self.guard)
                    else:
                        message = self.unsure.format(other=other_code)
                        checker.report(self.rule, literal, message, severity=Severity.WARNING)
