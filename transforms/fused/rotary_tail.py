"""NPU703's straight-tail search: a branch in front of the part of a body that is straight-line code.

When the tables are prepared under `if`s (x-transformers) or after a call the branch must not run again
(`x = self.bn(x)`), the body does not fold as a whole, or its branch would repeat that call;
`straight_tail_outcome` tries the tails of the body from the longest, reading the names the skipped
statements bind as they are there, and answers the first tail's outcome (`rotary_outcome`), its branch
placed in front of the tail's first statement.
"""

from __future__ import annotations

import ast

from npu_migrate.transforms.fused.rotary_branch import reruns
from npu_migrate.transforms.fused.rotary_outcome import folded_outcome
from npu_migrate.transforms.fused.rotary_rule import ROTARY
from npu_migrate.transforms.fused.rotary_screen import may_hold_site
from npu_migrate.transforms.fused.rotary_sites import sites
from npu_migrate.transforms.fused.rotation import Declined
from npu_migrate.transforms.fused.symbolic import (
    Function,
    NotStraightLine,
    Outcome,
    body_statements,
    cuda_only_tensor,
    fold,
    inline_functions,
    straight_tail,
)


def straight_tail_outcome(fn: Function) -> Outcome | None:
    """The branch in front of the longest straight-line tail of the body that holds the rotary embedding
    (x-transformers: the tables are prepared under `if`s, then rotated in straight-line code), for the
    values the names hold there; None when no tail holds one."""
    body = body_statements(fn.tree)
    # A tail holding a statement that is not straight-line (other than a CUDA-only fast path, which `fold`
    # reads) does not fold: the tails to try begin after the last such statement.
    blocks = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Assert, ast.Raise)
    first = 1 + max(
        (
            at
            for at, stmt in enumerate(body)
            if isinstance(stmt, blocks) and not (isinstance(stmt, ast.If) and cuda_only_tensor(stmt.test, fn))
        ),
        default=0,
    )
    if not may_hold_site(straight_tail(fn, max(first, 1), True)):
        # The longest tail holds every later one (a later tail keeps no assignment the longest does not
        # hold): without a product and a sum or join, none holds a site (`rotary_screen`, #26).
        return None
    for start in range(max(first, 1), len(body)):
        # The names the skipped statements bind, as they are (the branch reads them), and only where that
        # finds no rotation, with the assignments that still hold read as computed (litgpt's `rotated`).
        declines: list[Declined] = []
        for keep in (False, True):
            candidate = straight_tail(fn, start, keep)
            if keep and len(candidate.tree.body) == len(body) - start:
                continue  # nothing to keep: the tail just tried, whose outcome stands (#26)
            tail = candidate
            try:
                result = inline_functions(tail, fold(tail, unpack=True))
            except NotStraightLine:
                tail = None
                continue
            if sites(result, tail, declines):
                break
        else:
            if tail is None:
                continue
            read = next((d for d in declines if not d.differs), None)
            if read is not None:
                # A rotation read, in a shape the kernel does not take or at a size not known (torchtune's vision
                # rotary after its `if ...: raise`): said, not left silent. (A difference from the kernel's
                # formula is no evidence of a rotary embedding here: `(1 - t) * noise + t * x` has one.)
                return Outcome(ROTARY, f"rotary embedding not fused: {read}", remedy=read.remedy)
            return None
        if any(isinstance(n, ast.Name) and n.id.startswith("_npu_") for n in fn.nodes):
            return Outcome(
                ROTARY,
                "rotary embedding not fused: the code already uses `_npu_` names the branch needs",
                remedy="to fuse it, rename the code's own `_npu_` names",
            )
        outcome = folded_outcome(tail, result)
        if reruns(outcome) and start + 1 < len(body):
            continue  # the call is in this tail: a shorter one may begin after it
        if outcome is not None and outcome.template is not None:
            outcome.before = body[start]
        return outcome
    return None
