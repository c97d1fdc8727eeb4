"""Code that rules write into a user's file, laid out as the file's own code is: within its line width,
long statements split the way black and ruff's formatter split them, strings in double quotes.

Templates and matchers write each generated statement on one line (`ast.unparse` of what they build);
`fit` then splits the statements that are too wide for the file. The width is the file's
longest line, taken as at least 79 and at most 120 columns (`configured`, a project's line length, wins).

The module-level helpers (`templates/fused/*.py.j2`) are not laid out per file: they are written at
`NARROWEST`, 79 columns, which fits every file `line_width` measures. A project configured narrower than
PEP 8 (72, say) gets them at 79 all the same: rewrapping their comments and docstrings per project is not
worth a second copy of each helper, and a linter at that width flags them, which the reviewer sees.
"""

from __future__ import annotations

import ast
import io
import tokenize

#: Without a configured line length: no narrower than PEP 8's 79 columns, no wider than 120.
NARROWEST, WIDEST = 79, 120


def line_width(text: str, configured: int | None = None) -> int:
    """The width generated code must fit in a file with this text."""
    if configured is not None:
        return configured
    longest = max((len(line) for line in text.splitlines()), default=0)
    return max(NARROWEST, min(longest, WIDEST))


def fit(code: str, width: int, indent: str = "    ") -> str:
    """`code` (statements written at column 0) with double-quoted strings, and each statement or block
    header wider than `width` split: conditions one per line, calls and collections one item per line
    (all items on one line first, when they fit there), black's way."""
    code = double_quotes(code)
    tree = ast.parse(code)
    lines = code.splitlines(keepends=True)
    replaced: list[tuple[int, int, str]] = []  # (first line, last line, new text), 1-based
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        first = node.lineno
        last = node.body[0].lineno - 1 if isinstance(node, (ast.If, ast.While)) else node.end_lineno
        if max(len(line.rstrip("\r\n")) for line in lines[first - 1 : last]) <= width:
            continue
        text = _statement(node, " " * node.col_offset, width, indent)
        if text is not None:
            newline = lines[last - 1][len(lines[last - 1].rstrip("\r\n")) :] or "\n"
            replaced.append((first, last, text + newline))
    for first, last, text in sorted(replaced, reverse=True):
        lines[first - 1 : last] = [text]
    return "".join(lines)


def double_quotes(code: str) -> str:
    """Single-quoted string literals (as `ast.unparse` writes them) in double quotes, where that needs
    no escaping."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return code
    lines = code.splitlines(keepends=True)
    for token in reversed(tokens):
        text = token.string
        if token.type != tokenize.STRING or not text.startswith("'") or text.startswith("'''"):
            continue
        body = text[1:-1]
        if '"' in body or "\\" in body or token.start[0] != token.end[0]:
            continue
        row, start = token.start
        line = lines[row - 1]
        lines[row - 1] = f'{line[:start]}"{body}"{line[token.end[1] :]}'
    return "".join(lines)


def _statement(node: ast.stmt, margin: str, width: int, indent: str) -> str | None:
    """The statement's (or block header's) code laid out to `width`, or None for kinds left as they are."""
    if isinstance(node, (ast.If, ast.While)):
        keyword = "if" if isinstance(node, ast.If) else "while"
        return f"{margin}{keyword} {_condition(node.test, margin, width, indent, len(keyword) + 2)}:"
    if isinstance(node, ast.Return) and node.value is not None:
        return margin + "return " + _expression(node.value, margin, width, indent, len(margin) + 7)
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = _flat(node.targets[0]) + " = "
        return margin + target + _expression(node.value, margin, width, indent, len(margin) + len(target))
    if isinstance(node, ast.Expr):
        return margin + _expression(node.value, margin, width, indent, len(margin))
    if isinstance(node, ast.ImportFrom):
        head = f"from {'.' * node.level}{node.module or ''} import "
        names = [_flat_alias(a) for a in node.names]
        return margin + head + _bracketed("(", ")", names, margin, width, indent, len(margin) + len(head))
    return None


def _condition(test: ast.expr, margin: str, width: int, indent: str, taken: int) -> str:
    """An `if` condition: on the header line if it fits, else parenthesized, one operand of a top-level
    `and` / `or` a line."""
    flat = _flat(test)
    if len(margin) + taken + len(flat) <= width:
        return flat
    inner = margin + indent
    if isinstance(test, ast.BoolOp):
        word = "and" if isinstance(test.op, ast.And) else "or"
        parts = [
            _operand(value, inner, width, indent, len(inner) + (len(word) + 1 if index else 0))
            for index, value in enumerate(test.values)
        ]
        body = f"\n{inner}{word} ".join(parts)
    else:
        body = _operand(test, inner, width, indent, len(inner), boolean=False)
    return f"(\n{inner}{body}\n{margin})"


#: The comparison operators `_operand` puts at the start of a line of their own.
_COMPARISONS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}


def _operand(node: ast.expr, margin: str, width: int, indent: str, column: int, boolean: bool = True) -> str:
    """One operand of a condition, inside its parentheses: a comparison too wide for its line goes on
    two, its operator opening the second (`x.dtype` / `in (torch.float16, ...)`), black's way."""
    laid = _expression(node, margin, width, indent, column, operand=boolean)
    if column + len(laid.split("\n")[0]) <= width or not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return laid
    operator = _COMPARISONS.get(type(node.ops[0]))
    left, right = node.left, node.comparators[0]
    if operator is None or f"{_flat(left)} {operator} {_flat(right)}" != _flat(node):
        return laid  # an operand that needs parentheses of its own: left as it is
    second = _expression(right, margin, width, indent, len(margin) + len(operator) + 1)
    return f"{_expression(left, margin, width, indent, column)}\n{margin}{operator} {second}"


def _expression(
    node: ast.expr, margin: str, width: int, indent: str, column: int, operand: bool = False, after: int = 0
) -> str:
    """`node` starting at `column` on a line indented by `margin`, `after` more characters following it on
    its last line (a comma, a `.to(dtype)`), split at its outermost brackets when it does not fit.
    `operand`: it stands in an `and` / `or`, so a lower-precedence expression keeps parens."""
    flat = _flat(node)
    if operand and isinstance(node, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)):
        flat = f"({flat})"
    if column + len(flat) + after <= width:
        return flat
    if isinstance(node, ast.Call):
        func = node.func
        head = _flat(func) + "("
        # `f(...).to(dtype)`, `f(...)[0].to(dtype)`: split the inner call when what follows it is short, as
        # black does, or when the line cannot even hold the outer call's name.
        if isinstance(func, ast.Attribute) and _chained_call(func.value):
            tail = f".{func.attr}({', '.join(_flat(a) for a in _arguments(node))})"
            if len(tail) <= width // 4 or column + len(head) > width:
                return _expression(func.value, margin, width, indent, column, after=len(tail) + after) + tail
        items = [_argument(a) for a in _arguments(node)]
        return head + _bracketed(
            "", ")", items, margin, width, indent, column + len(head), _arguments(node), after=after
        )
    if isinstance(node, ast.Tuple):
        items = [_flat(e) for e in node.elts]
        return _bracketed(
            "(", ")", items, margin, width, indent, column, node.elts, tuple_of_one=len(items) == 1, after=after
        )
    if isinstance(node, (ast.List, ast.Set)):
        opening, closing = ("[", "]") if isinstance(node, ast.List) else ("{", "}")
        items = [_flat(e) for e in node.elts]
        return _bracketed(opening, closing, items, margin, width, indent, column, node.elts, after=after)
    if isinstance(node, (ast.Attribute, ast.Subscript)) and _chained_call(node.value):
        tail = flat[len(_flat(node.value)) :] if flat.startswith(_flat(node.value)) else None
        if tail is not None:
            return _expression(node.value, margin, width, indent, column, after=len(tail) + after) + tail
    return flat


def _chained_call(node: ast.expr) -> bool:
    """Whether `node` is a call, or an attribute or item of one (`f(x)`, `f(x)[0]`): what a method call
    or subscript can follow on the call's closing line."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Call)


def _bracketed(
    opening: str,
    closing: str,
    items: list[str],
    margin: str,
    width: int,
    indent: str,
    column: int,
    nodes: list | None = None,
    tuple_of_one: bool = False,
    after: int = 0,
) -> str:
    """Items in brackets (`after` more characters following the closing one): on the line if they fit;
    else all on one indented line; else one a line, each split further where it needs to be, with a
    trailing comma."""
    joined = ", ".join(items) + ("," if tuple_of_one else "")
    if column + len(opening) + len(joined) + len(closing) + after <= width:
        return opening + joined + closing
    inner = margin + indent
    if len(inner) + len(joined) <= width and not tuple_of_one:
        return f"{opening}\n{inner}{joined}\n{margin}{closing}"
    parts = []
    for index, item in enumerate(items):
        node = nodes[index] if nodes is not None else None
        if isinstance(node, ast.keyword):
            prefix = f"{node.arg}=" if node.arg else "**"
            item = prefix + _expression(node.value, inner, width, indent, len(inner) + len(prefix), after=1)
        elif isinstance(node, ast.Starred):
            item = "*" + _expression(node.value, inner, width, indent, len(inner) + 1, after=1)
        elif isinstance(node, ast.expr):
            item = _expression(node, inner, width, indent, len(inner), after=1)
        parts.append(f"{inner}{item},\n")
    return f"{opening}\n{''.join(parts)}{margin}{closing}"


def _arguments(call: ast.Call) -> list[ast.AST]:
    return [*call.args, *call.keywords]


def _argument(node: ast.AST) -> str:
    if isinstance(node, ast.keyword):
        return f"{node.arg}={_flat(node.value)}" if node.arg else f"**{_flat(node.value)}"
    return _flat(node)


def _flat_alias(alias: ast.alias) -> str:
    return f"{alias.name} as {alias.asname}" if alias.asname else alias.name


def _flat(node: ast.AST) -> str:
    return double_quotes(ast.unparse(node))
