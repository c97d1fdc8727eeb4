"""The argument a call passes for a parameter, by keyword or by position."""

from __future__ import annotations

import libcst as cst


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def argument(call: cst.Call, position: int, name: str) -> cst.Arg | None:
    """The argument of `call` bound to parameter `name`, which sits at `position` when positional."""
    found = keyword(call, name)
    if found is not None:
        return found
    positional = []
    for arg in call.args:
        if arg.keyword is not None or arg.star == "**":
            break
        if arg.star == "*":  # where the later arguments land is unknown
            return None
        positional.append(arg)
    return positional[position] if position < len(positional) else None
