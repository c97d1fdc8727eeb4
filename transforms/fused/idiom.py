"""What a fused-op idiom module declares about itself: the one registration of an idiom.

Each module of this package that defines `IDIOM = Idiom(...)` is an idiom; `FusedOpsChecker` finds them
(tried in rule-id order) and derives from their declarations everything it used to list by hand: the
rules, the text markers, the identifier prefilters, the helper templates and the names they define, and
the calls rewritten in place. Adding an idiom is its module (rule, matcher, `IDIOM`), its templates, the
CPU reference op of each kernel it calls (`npu_migrate.verify.reference.OPS`, by kernel name) and its
fixtures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ast

    import libcst as cst

    from npu_migrate.engine.rule import Rule
    from npu_migrate.transforms.fused.symbolic import Function, Outcome


@dataclass(frozen=True)
class Idiom:
    """One fused idiom: what finds it, what it injects, and which torch_npu kernels that calls."""

    rule: Rule
    #: Substrings of a function's source (or its class's) without which `match` is not asked.
    markers: tuple[str, ...]
    #: The identifiers the idiom cannot be written without: a file must use one of them (a tuple: all of
    #: its names) to be looked at, checked on the words of the text and again on the `ast`'s names.
    identifiers: tuple[str | tuple[str, ...], ...]
    #: The torch_npu ops its rewrites call: each has a CPU reference op of that name.
    kernels: tuple[str, ...]
    #: Function -> a branch to inject or a declined finding, or None when the function is not the idiom.
    match: Callable[[Function], Outcome | None]
    #: The template of the branch `match` injects, if it injects one.
    template: str | None = None
    #: Other branch templates `match` may return (NPU702's branch in place of a statement).
    templates: tuple[str, ...] = ()
    #: Helper template -> the module-level name it defines: what the branch calls besides the prelude,
    #: inserted once per file, and recognised as present by that name.
    helpers: Mapping[str, str] = field(default_factory=dict)
    #: Qualified names of functions whose calls the idiom rewrites where they stand (as SDPA's), with
    #: `match_call(name, api, names, call, guards)` deciding (`names`: the file's identifiers; `call`: the
    #: `ast` node; `guards`: the tests of the `if`s of its function whose body holds it) and
    #: `wrap_call(call, **outcome.context)` the libcst fix of the call.
    calls: tuple[str, ...] = ()
    match_call: Callable[[str, object, object, ast.Call, tuple[ast.expr, ...]], Outcome | None] | None = None
    wrap_call: Callable[..., cst.Call] | None = None
    #: The package `calls` come from when an NPU host does not have it (flash_attn): its calls also match
    #: through a name a try-import binds and its `except` rebinds (`flash_attn_func = None`), an import of
    #: it that only feeds wrapped calls is made conditional, and any other an NPU host runs is reported
    #: (`optional_imports`; the package must be one of `identifiers`, so that its files are looked at).
    optional_package: str | None = None
    #: `match_call` also gets `resolve`, the qualified name of a Name/Attribute chain of the call's arguments
    #: (through a try-import too): xformers' `attn_bias=xops.LowerTriangularMask()`.
    resolves_arguments: bool = False
    #: Call -> the parts of its arguments `wrap_call` defers to where the original function runs (behind a
    #: lambda): an import of `optional_package` they read may still be made conditional.
    deferred: Callable[[ast.Call], list[ast.expr]] | None = None

    def __post_init__(self) -> None:
        if bool(self.calls) != (self.match_call is not None) or bool(self.calls) != (self.wrap_call is not None):
            raise ValueError(f"{self.rule.id}: `calls`, `match_call` and `wrap_call` go together")

    def uses_identifiers(self, uses: Callable[[str], bool]) -> bool:
        """Whether a file for which `uses(name)` tells which identifiers it has can hold the idiom."""
        return any(
            uses(needed) if isinstance(needed, str) else all(uses(name) for name in needed)
            for needed in self.identifiers
        )
