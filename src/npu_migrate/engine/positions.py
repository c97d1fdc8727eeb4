"""Line and column of a few nodes, for the cost of one code generation.

libcst's `PositionProvider` keeps a position for every node of the module: a Python-level line/column
update per token and a `CodeRange` per node, which costs about 2.5 times the parse. Findings need the
positions of a handful of nodes (and, for suppression comments and `--annotate`, of the statements), so
`positions_of` runs the same code generation with a state that records nothing but the token count at
the start and end of the nodes asked for. Token counts become characters and characters become lines
and columns once, at the end, with C-level string operations.

The ranges are the ones `PositionProvider` gives, syntactic and whitespace-inclusive rules included:
a node with a syntactic position (`record_syntactic_position`) gets it, with the start or end taken from
a child where libcst says so (`IndentedBlock`, `If` ...); any other node its whitespace-inclusive span.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState

# libcst.metadata re-exports these; importing it loads every metadata provider (20 ms of start-up).
from libcst._position import CodePosition, CodeRange

from npu_migrate.engine.fixes import STATEMENT_TYPES
from npu_migrate.engine.lines import LINE_BREAK  # the line breaks libcst's position providers count


class _State(CodegenState):
    """Code generation that notes, for the tracked nodes only, how many tokens were out at their start
    and end. Nodes are keyed by `id()`: `CSTNode.__hash__` is a Python function."""

    __slots__ = ("tracked", "inclusive_start", "computed")

    def __init__(self, module: cst.Module, tracked: dict[int, cst.CSTNode]) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.tracked = tracked
        self.inclusive_start: dict[int, int] = {}
        #: id -> (start token count, end token count); a syntactic position overwrites, a whitespace-
        #: inclusive one never does, in the order PositionProvider writes them
        self.computed: dict[int, tuple[int, int]] = {}

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.tracked:
            self.inclusive_start[id(node)] = len(self.tokens)

    def after_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.tracked:
            start = self.inclusive_start.pop(key)
            if key not in self.computed:
                self.computed[key] = (start, len(self.tokens))

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        if id(node) not in self.tracked:
            return _UNTRACKED
        # The hoisted start or end comes from a child generated inside the block, so tracking it now is
        # in time.
        for child in (start_node, end_node):
            if child is not None:
                self.tracked.setdefault(id(child), child)
        return _Syntactic(self, node, start_node, end_node)

    def pop_trailing_newline(self) -> None:
        # PositionProvider counts the trailing newline it pops (its line and column were advanced when the
        # token was added); keeping the token keeps token counts and positions in step. The generated
        # text is never used.
        pass


class _StatementState(_State):
    """`_State` that also tracks every statement it meets."""

    __slots__ = ("statements",)

    def __init__(self, module: cst.Module, tracked: dict[int, cst.CSTNode], statements: frozenset[type]) -> None:
        super().__init__(module, tracked)
        self.statements = statements

    def before_codegen(self, node: cst.CSTNode) -> None:
        if type(node) in self.statements:
            self.tracked[id(node)] = node
            self.inclusive_start[id(node)] = len(self.tokens)
        elif id(node) in self.tracked:
            self.inclusive_start[id(node)] = len(self.tokens)


class _Untracked:
    """The context manager for the nodes nobody asked about: cheaper than libcst's own no-op, which is a
    generator-based `contextmanager`."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_UNTRACKED = _Untracked()


class _Syntactic:
    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _State, node, start_node, end_node) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = len(self.state.tokens)

    def __exit__(self, *exc) -> None:
        computed = self.state.computed
        start = computed[id(self.start_node)][0] if self.start_node is not None else self.start
        end = computed[id(self.end_node)][1] if self.end_node is not None else len(self.state.tokens)
        computed[id(self.node)] = (start, end)


def positions_of(
    module: cst.Module, wanted: Iterable[cst.CSTNode] = (), *, statements: bool = False
) -> dict[cst.CSTNode, CodeRange]:
    """The `PositionProvider` range of each node of `wanted` that occurs in `module` (nodes compared by
    identity), and with `statements` also of every `SimpleStatementLine` and compound statement."""
    tracked = {id(node): node for node in wanted}
    asked = dict(tracked)
    if statements:
        state: _State = _StatementState(module, tracked, STATEMENT_TYPES)
    else:
        if not tracked:
            return {}
        state = _State(module, tracked)
    module._codegen(state)
    if statements:
        asked.update((key, node) for key, node in tracked.items() if type(node) in STATEMENT_TYPES)
    found = {key: state.computed[key] for key in asked if key in state.computed}
    to_position = _Converter(state.tokens, {count for span in found.values() for count in span})
    return {asked[key]: CodeRange(to_position[start], to_position[end]) for key, (start, end) in found.items()}


class _Converter(dict):
    """Token count -> CodePosition, for the counts in `needed`."""

    def __init__(self, tokens: list[str], needed: set[int]) -> None:
        super().__init__()
        if not needed:
            return
        offsets = [0, *accumulate(map(len, tokens))]
        text = "".join(tokens)
        newline_ends = [match.end() for match in LINE_BREAK.finditer(text)]
        if "\r\n" in text:
            newline_ends = _split_at_token_boundaries(text, newline_ends, set(offsets))
        for count in needed:
            offset = offsets[count]
            line = bisect_right(newline_ends, offset)
            column = offset - newline_ends[line - 1] if line else offset
            self[count] = CodePosition(line + 1, column)


def _split_at_token_boundaries(text: str, newline_ends: list[int], boundaries: set[int]) -> list[int]:
    """PositionProvider splits each token at its own newlines, so a `\\r` ending one token and a `\\n`
    starting the next are two line breaks to it, where a scan of the joined text sees one `\\r\\n`."""
    result = []
    for end in newline_ends:
        if text[end - 2 : end] == "\r\n" and end - 1 in boundaries:
            result.append(end - 1)
        result.append(end)
    return result
