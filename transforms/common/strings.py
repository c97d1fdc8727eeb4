"""Reading and replacing plain string literals without changing how they are spelled."""

from __future__ import annotations

import libcst as cst


def string_value(node: cst.CSTNode | None) -> str | None:
    """The value of a plain (non-bytes, non-f) string literal, else None."""
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        try:
            value = node.evaluated_value
        except Exception:  # malformed escapes: not ours to judge
            return None
        return value if isinstance(value, str) else None
    return None


def replaceable(node: cst.CSTNode | None) -> str | None:
    """Like `string_value`, but only for literals spelled without escapes, whose body can be swapped verbatim."""
    value = string_value(node)
    if value is None:
        return None
    prefix_len = len(node.prefix) + len(node.quote)
    return value if node.value[prefix_len : -len(node.quote)] == value else None


def with_value(node: cst.SimpleString, value: str) -> cst.SimpleString:
    """`node` holding `value` instead, with its prefix and quotes kept."""
    prefix_len = len(node.prefix) + len(node.quote)
    return node.with_changes(value=node.value[:prefix_len] + value + node.quote)
