"""CUDA devices spelled as literals (`"cuda"`, `"cuda:0"`, `f"cuda:{i}"`, `"cuda:{}".format(i)`, `"cuda:%d" % i`),
found and rewritten to name the NPU wherever a rule family knows a device is meant."""

from __future__ import annotations

import re

import libcst as cst

from npu_migrate.transforms.common.strings import string_value

DEVICE_LITERAL = re.compile(r"cuda(:\d+)?")
DEVICE_TEMPLATE = re.compile(r"cuda:(\{\d*\}|%[dis])")


def device_literal(node: cst.CSTNode) -> cst.CSTNode | None:
    """The string node to rewrite if `node` is a CUDA device spelled as a literal, else None.

    Accepts "cuda", "cuda:0", f"cuda:{i}", "cuda:{}".format(i) and "cuda:%d" % i.
    """
    value = string_value(node)
    if value is not None:
        return node if DEVICE_LITERAL.fullmatch(value) else None
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        if (
            len(parts) >= 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and all(isinstance(p, cst.FormattedStringExpression) for p in parts[1:])
        ):
            return node
        return None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        template = string_value(node.func.value)
        return node.func.value if template is not None and DEVICE_TEMPLATE.fullmatch(template) else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        template = string_value(node.left)
        return node.left if template is not None and DEVICE_TEMPLATE.fullmatch(template) else None
    return None


def has_device_literal(index) -> bool:
    """Whether some string of the file (an `AstIndex`) can be what `device_literal` matches: "cuda",
    "cuda:N", a "cuda:{}" / "cuda:%d" template, or "cuda:", which an f"cuda:{i}" begins with."""
    return any(
        value.startswith("cuda")
        and (value == "cuda:" or DEVICE_LITERAL.fullmatch(value) or DEVICE_TEMPLATE.fullmatch(value))
        for value in index.strings
    )


def rewrite_device_literal(node: cst.CSTNode) -> cst.CSTNode:
    """The fix for a node returned by `device_literal`."""
    if isinstance(node, cst.SimpleString):
        return _swap_quoted(node)
    assert isinstance(node, cst.FormattedString)
    first = node.parts[0]
    return node.with_changes(parts=[first.with_changes(value="npu:"), *node.parts[1:]])


def _swap_quoted(node: cst.SimpleString) -> cst.SimpleString:
    prefix_len = len(node.prefix) + len(node.quote)
    body = node.value[prefix_len:]
    return node.with_changes(value=node.value[:prefix_len] + body.replace("cuda", "npu", 1))


def accelerator_indexed(node: cst.CSTNode, accelerator: cst.Name) -> cst.FormattedString | None:
    """The portable spelling of a CUDA device literal with an index (`device_literal`'s node), the accelerator's
    type named by `accelerator`: "cuda:1" -> f"{ACCELERATOR}:1", f"cuda:{i}" -> f"{ACCELERATOR}:{i}", and the
    template of "cuda:%d" % i -> f"{ACCELERATOR}:%d". None for a `.format` template, whose braces an f-string
    would read."""
    named = cst.FormattedStringExpression(expression=accelerator)
    if isinstance(node, cst.FormattedString):
        first = node.parts[0]
        return node.with_changes(parts=[named, first.with_changes(value=":"), *node.parts[1:]])
    value = string_value(node) if isinstance(node, cst.SimpleString) else None
    if value is None or not value.startswith("cuda:") or "{" in value:
        return None
    text = cst.FormattedStringText(value[len("cuda") :])
    return cst.FormattedString(parts=[named, text], start=f"f{node.quote}", end=node.quote)


def indexed_device(accelerator: cst.Name, index: cst.BaseExpression) -> cst.FormattedString:
    """f"{ACCELERATOR}:{index}" (f"{ACCELERATOR}:0" for a literal index)."""
    named = cst.FormattedStringExpression(expression=accelerator)
    if isinstance(index, cst.Integer):
        return cst.FormattedString(parts=[named, cst.FormattedStringText(f":{index.value}")])
    return cst.FormattedString(parts=[named, cst.FormattedStringText(":"), cst.FormattedStringExpression(index)])
