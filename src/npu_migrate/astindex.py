"""The second, cheaper-than-libcst prefilter: what identifiers and strings a file really uses.

Every parsed file goes through `ast.parse` first anyway (to vet it for libcst), so one walk over that
tree tells each checker whether the file can possibly match: `cuda` as an attribute or imported name,
not in a comment or a docstring; `"nccl"` as a string, not in a log message's prose. Only files some
checker wants are parsed by libcst, which costs ten times more than `ast`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

_LONG_STRING = 200  # longer constants are prose (docstrings, help texts), never an identifier-like value


@dataclass
class AstIndex:
    names: set[str] = field(default_factory=set)  # names, attribute names, imported names, keywords, defs
    strings: set[str] = field(default_factory=set)  # short string constants

    @classmethod
    def of(cls, tree: ast.AST) -> AstIndex:
        index = cls()
        names, strings = index.names, index.strings
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant):
                if isinstance(node.value, str) and len(node.value) <= _LONG_STRING:
                    strings.add(node.value)
            elif isinstance(node, ast.alias):
                names.update(node.name.split("."))
                if node.asname:
                    names.add(node.asname)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.update(node.module.split("."))
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
        return index

    def uses(self, *names: str) -> bool:
        return any(name in self.names for name in names)

    def may_name(self, needed: tuple[frozenset[str], ...]) -> bool:
        """Whether a name resolved through the file's imports can be one of the qualified names `needed` was
        made from (`name_sets`), or lie below one. Each part of a resolved name is an imported module or
        name or an attribute, so one of `names`, however the file imports and aliases it."""
        return any(parts <= self.names for parts in needed)

    def string_containing(self, *fragments: str) -> bool:
        return any(fragment in value for value in self.strings for fragment in fragments)


def name_sets(qualnames: Iterable[str]) -> tuple[frozenset[str], ...]:
    """The parts of each qualified name, for `AstIndex.may_name`. A set that holds a smaller one is left
    out: the file that has its parts has the smaller one's."""
    sets = {frozenset(qualname.split(".")) for qualname in qualnames}
    return tuple(s for s in sets if not any(other < s for other in sets))
