"""The second, cheaper-than-libcst prefilter: what identifiers and strings a file really uses.

Every parsed file goes through `ast.parse` first anyway (to vet it for libcst), so one walk over that
tree tells each checker whether the file can possibly match: `cuda` as an attribute or imported name,
not in a comment or a docstring; `"nccl"` as a string, not in a log message's prose. Only files some
checker wants are parsed by libcst, which costs ten times more than `ast`.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

_LONG_STRING = 200  # longer constants are prose (docstrings, help texts), never an identifier-like value
_DEFINITIONS = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef})


@dataclass
class AstIndex:
    names: set[str] = field(default_factory=set)  # names, attribute names, imported names, keywords, defs
    strings: set[str] = field(default_factory=set)  # short string constants
    attributes: set[str] = field(default_factory=set)  # attribute names only (`.backward`, not `def backward`)
    #: `name.attr` where the attribute is read off a plain name (`torch.compile`, `re.compile`), as pairs.
    pairs: set[tuple[str, str]] = field(default_factory=set)
    #: What each `import` binds: (the name bound, the module it is bound to).
    modules: set[tuple[str, str]] = field(default_factory=set)
    #: What each `from module import name` imports: (module, name); `*` for a star import.
    imported: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def of(cls, tree: ast.AST) -> AstIndex:
        # A walk of its own: `ast.walk`'s nested generators and a chain of isinstance tests per node cost
        # about twice this, which on files with nothing to migrate is most of what they cost.
        index = cls()
        names, strings, attributes, pairs = index.names, index.strings, index.attributes, index.pairs
        Name, Attribute, Constant, alias, Import, ImportFrom, keyword, AST = (  # noqa: N806  (locals are faster)
            ast.Name,
            ast.Attribute,
            ast.Constant,
            ast.alias,
            ast.Import,
            ast.ImportFrom,
            ast.keyword,
            ast.AST,
        )
        stack = [tree]
        while stack:
            node = stack.pop()
            kind = type(node)
            if kind is Name:
                names.add(node.id)
                continue
            if kind is Attribute:
                attr = node.attr
                names.add(attr)
                attributes.add(attr)
                value = node.value
                if type(value) is Name:
                    pairs.add((value.id, attr))
                stack.append(value)
                continue
            if kind is Constant:
                value = node.value
                if type(value) is str and len(value) <= _LONG_STRING:
                    strings.add(value)
                continue
            if kind is alias:
                names.update(node.name.split("."))
                if node.asname:
                    names.add(node.asname)
                continue
            if kind is ImportFrom:
                if node.module:
                    names.update(node.module.split("."))
                    index.imported.update((node.module, a.name) for a in node.names)
            elif kind is Import:
                for a in node.names:
                    # `import torch.nn` binds `torch`; `import torch.nn as nn` binds nn to torch.nn.
                    module = a.name if a.asname else a.name.split(".", 1)[0]
                    index.modules.add((a.asname or module, module))
            elif kind is keyword:
                if node.arg:
                    names.add(node.arg)
            elif kind in _DEFINITIONS:
                names.add(node.name)
            for field_name in node._fields:
                value = getattr(node, field_name, None)
                if type(value) is list:
                    stack.extend(item for item in value if isinstance(item, AST))
                elif isinstance(value, AST):
                    stack.append(value)
        return index

    def may_use(self, module: str, attr: str) -> bool:
        """Whether the file may refer to `module.attr` (`torch.compile`) as an import resolves it: read as an
        attribute of a name an `import` binds to the module, or imported from it (by name or `*`)."""
        if (module, attr) in self.imported or (module, "*") in self.imported:
            return True
        return any(bound_to == module and (bound, attr) in self.pairs for bound, bound_to in self.modules)

    def uses(self, *names: str) -> bool:
        return any(name in self.names for name in names)

    def may_name(self, needed: tuple[frozenset[str], ...]) -> bool:
        """Whether a name resolved through the file's imports can be one of the qualified names `needed` was
        made from (`name_sets`), or lie below one. Each part of a resolved name is an imported module or
        name or an attribute, so one of `names`, however the file imports and aliases it."""
        return words_may_name(self.names, needed)


def words_may_name(words: frozenset[str] | set[str], needed: tuple[frozenset[str], ...]) -> bool:
    """`AstIndex.may_name` on identifiers, or on a superset of them such as `text_words`, which the ast
    filter can then only narrow."""
    return any(parts <= words for parts in needed)


def name_sets(qualnames: Iterable[str]) -> tuple[frozenset[str], ...]:
    """The parts of each qualified name, for `AstIndex.may_name`. A set that holds a smaller one is left
    out: the file that has its parts has the smaller one's."""
    sets = {frozenset(qualname.split(".")) for qualname in qualnames}
    return tuple(s for s in sets if not any(other < s for other in sets))


_WORD = re.compile(r"\w+")


def text_words(text: str) -> frozenset[str]:
    """Every identifier-like word of the text, comments and strings included: a superset of the ASCII
    names `AstIndex` finds (at a twentieth of the cost of the parse and walk), for checkers that can rule
    a file out on the words alone (`wants_words`), which look up ASCII names only. Python reads
    identifiers NFKC-normalised (`ｓｉｎ` is `sin`), so non-ASCII words count in that form too. (A
    non-ASCII identifier can hold characters that `\\w` does not match, such as `·`: it is never ASCII.)"""
    words = set(_WORD.findall(text))
    if not text.isascii():
        words.update([unicodedata.normalize("NFKC", w) for w in words if not w.isascii()])
    return frozenset(words)
