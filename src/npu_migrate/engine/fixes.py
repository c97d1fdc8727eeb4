"""Applying libcst fixes: every fix of a tree in one pass, each seeing its node with the children already
rewritten, so that fixes of nested nodes compose."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

Fix = Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel]


def _subclasses(base: type) -> set[type]:
    found = set()
    for sub in base.__subclasses__():
        found.add(sub)
        found |= _subclasses(sub)
    return found


# The concrete types of what `lines.StatementIndex` indexes: `isinstance` against an ABC, for every node,
# would cost more than the code generation itself.
STATEMENT_TYPES = frozenset({cst.SimpleStatementLine} | _subclasses(cst.BaseCompoundStatement))


class FixApplier(cst.CSTTransformer):
    """`skip(node)` true: nothing under `node` is fixed, so the walk does not go in (a statement whose
    lines hold no fixed node)."""

    def __init__(
        self, fixes: Iterable[tuple[cst.CSTNode, Fix]], skip: Callable[[cst.CSTNode], bool] | None = None
    ) -> None:
        super().__init__()
        self.fixes: dict[int, list[Fix]] = {}
        for node, fix in fixes:
            self.fixes.setdefault(id(node), []).append(fix)
        #: id of an original node -> what the fixes made of it
        self.results: dict[int, cst.CSTNode | cst.FlattenSentinel] = {}
        self.skip = skip

    def on_visit(self, node) -> bool:
        return self.skip is None or not self.skip(node)

    def on_leave(self, original_node, updated_node):
        fixes = self.fixes.get(id(original_node))
        if not fixes:
            return updated_node
        for fix in fixes:
            updated_node = fix(updated_node)
        self.results[id(original_node)] = updated_node
        return updated_node


def apply_fixes(
    module: cst.Module, fixes: list[tuple[cst.CSTNode, Fix]], skip: Callable[[cst.CSTNode], bool] | None = None
) -> tuple[cst.Module, FixApplier]:
    """The module with every fix applied, and the applier (which knows what each fixed node became).
    The walk does not go into a node `skip` says holds no fixed node; if a fix was missed that way after
    all, everything is walked again."""
    applier = FixApplier(fixes, skip)
    if not applier.fixes:
        return module, applier
    new_module = module.visit(applier)
    if skip is not None and len(applier.results) < len(applier.fixes):
        applier = FixApplier(fixes)
        new_module = module.visit(applier)
    return new_module, applier


def skip_statements_apart(fixed: list[tuple[int, int]], positions) -> Callable[[cst.CSTNode], bool]:
    """A `skip` for `apply_fixes`: true for a statement with a known position (decorators included) whose
    lines overlap none of the line ranges `fixed`."""

    def skip(node: cst.CSTNode) -> bool:
        if type(node) not in STATEMENT_TYPES:
            return False
        where = positions.get(node)
        if where is None:
            return False
        decorators = getattr(node, "decorators", None)
        first = positions.get(decorators[0]) if decorators else None
        start = first.start.line if first is not None else where.start.line
        return not any(start <= end and begin <= where.end.line for begin, end in fixed)

    return skip


def node_code(node: cst.CSTNode | cst.FlattenSentinel) -> str:
    empty = cst.Module(body=[])
    if isinstance(node, cst.FlattenSentinel):
        return "".join(empty.code_for_node(n) for n in node.nodes)
    return empty.code_for_node(node)
