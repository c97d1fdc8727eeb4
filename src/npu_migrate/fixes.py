"""Applying libcst fixes: every fix of a tree in one pass, each seeing its node with the children already
rewritten, so that fixes of nested nodes compose."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

Fix = Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel]


class FixApplier(cst.CSTTransformer):
    """`skip(node)` true: nothing under `node` is fixed, so the walk does not go in (a statement whose
    lines hold no fixed node)."""

    def __init__(self, fixes: Iterable[tuple[cst.CSTNode, Fix]], skip: Callable[[cst.CSTNode], bool] | None = None) -> None:
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
    module: cst.Module, fixes: list[tuple[cst.CSTNode, Fix]], untouched: set[int] = frozenset()
) -> tuple[cst.Module, FixApplier]:
    """The module with every fix applied, and the applier (which knows what each fixed node became).
    The top-level statements at the indexes `untouched` hold no fixed node and are not walked; fixes of
    the module itself (an added import) are applied last, to the module with its statements fixed, as a
    whole walk would."""
    applier = FixApplier(fixes)
    if not applier.fixes:
        return module, applier
    if not untouched:
        return module.visit(applier), applier
    module_fixes = applier.fixes.pop(id(module), [])
    body = []
    for index, stmt in enumerate(module.body):
        if index in untouched:
            body.append(stmt)
            continue
        result = stmt.visit(applier)
        if isinstance(result, cst.FlattenSentinel):
            body.extend(result.nodes)
        elif not isinstance(result, cst.RemovalSentinel):
            body.append(result)
    if len(applier.results) < len(applier.fixes):  # a fixed node outside the statements walked
        applier = FixApplier(fixes)
        return module.visit(applier), applier
    updated = module.with_changes(body=body)
    for fix in module_fixes:
        updated = fix(updated)
    if module_fixes:
        applier.fixes[id(module)] = module_fixes
        applier.results[id(module)] = updated
    return updated, applier


def node_code(node: cst.CSTNode | cst.FlattenSentinel) -> str:
    empty = cst.Module(body=[])
    if isinstance(node, cst.FlattenSentinel):
        return "".join(empty.code_for_node(n) for n in node.nodes)
    return empty.code_for_node(node)
