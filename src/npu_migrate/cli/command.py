"""How every `npu-migrate` command presents its help: plain click formatting (no rich: faster start-up, and
examples keep their layout), and arguments shown by their metavar rather than a Python type (`<list[Path]>`)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import get_args, get_origin

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

try:  # typer >= 0.2x: converts values itself (through pydantic), with this for paths
    from typer._param_types import coerce_cli_path
except ImportError:  # older typer: click converts them, and `_LightCoercion` is not used
    coerce_cli_path = None

#: The Typer settings every app of ours uses: `-h` as well as `--help`, and no rich formatting.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


class _LightParams:
    """Every parameter of the command (the help option click adds too) converted by `_LightCoercion`."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            typer_coercion = getattr(param, "get_runtime_param", None)  # typer >= 0.2x
            if typer_coercion is not None and hasattr(param, "type_descriptor") and not hasattr(param, "_light"):
                param._light = True
                param.get_runtime_param = functools.partial(_LightCoercion, typer_coercion)
        return params


class Group(_LightParams, TyperGroup):
    """The `npu-migrate` group (its `--version` and `--help`)."""


class Command(_LightParams, TyperCommand):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):
                param.display_type_rich = _no_type
                param._usage_display_name = functools.partial(_usage_name, param)
            elif isinstance(param, TyperOption) and param.metavar is None:
                param.display_type_rich = functools.partial(_plain_metavar, param)


class _LightCoercion:
    """typer (>= 0.2x) converts every parameter's value through a pydantic TypeAdapter, and importing
    pydantic is a third of what a one-file `apply --check` costs. The values that need no conversion are
    taken as typer would return them: None, a default that already has its type, strings for `str` and
    `list[str]`, and paths, which typer's own `coerce_cli_path` checks once made `Path`s (all pydantic
    does for them). Anything else goes to typer's coercion, built when first needed."""

    def __init__(self, typer_coercion) -> None:
        self._typer_coercion = typer_coercion  # the parameter's own `get_runtime_param`

    def coerce(self, value, param, ctx):
        descriptor = param.type_descriptor
        info = descriptor.parameter_info
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None  # as typer's RuntimeParam.coerce
        annotation = descriptor.annotation
        if info.parser is None and descriptor.file_annotation is None:
            element = _list_of(annotation) if multi else annotation
            values = list(value) if multi and isinstance(value, (list, tuple)) else None
            if element is str and values is not None and all(isinstance(v, str) for v in values):
                return values
            if isinstance(element, type) and issubclass(element, Path) and info.path_type is None:
                if values is not None and all(isinstance(v, str) for v in values):
                    return [coerce_cli_path(element(v), info, path_type=element, param=param, ctx=ctx) for v in values]
                if not multi and isinstance(value, str):
                    return coerce_cli_path(element(value), info, path_type=element, param=param, ctx=ctx)
            elif not multi and isinstance(annotation, type) and isinstance(value, annotation):
                in_range = (info.min is None or value >= info.min) and (info.max is None or value <= info.max)
                if not descriptor.is_ranged or in_range:
                    return value
        return self._typer_coercion().coerce(value, param=param, ctx=ctx)


def _list_of(annotation):
    return get_args(annotation)[0] if get_origin(annotation) is list and len(get_args(annotation)) == 1 else None


def _no_type(ctx) -> None:
    return None


def _usage_name(param: TyperArgument) -> str:
    """`PATH...` and `[RULE]` in the usage line, not typer's `{PATH}...`."""
    name = param.metavar or param.name.upper()
    name = name + "..." if param.nargs != 1 else name
    return name if param.required else f"[{name}]"


def _plain_metavar(param: TyperOption, ctx) -> str:
    """`<path>` -> PATH, `<int range>` -> INT, `<text|json>` -> {text|json}: metavars as other tools print them."""
    label = param.display_type(ctx).strip("<>")
    if "|" in label:
        return "{" + label + "}"
    return {"str": "TEXT"}.get(label, label.split()[0].upper())


def examples(*lines: str) -> str:
    """An epilog of example command lines, laid out as written (click's `\\b` keeps it from re-wrapping)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


#: What pydantic puts before the message of a ValueError raised while typer converts an option's value.
_PYDANTIC_PREFIX = "Value error, "


def _click_exception() -> type[Exception]:
    # typer >= 0.20 vendors click (and exports only BadParameter of its errors); older typer uses click itself.
    try:
        from typer._click.exceptions import ClickException
    except ImportError:
        from click.exceptions import ClickException
    return ClickException


def run(app: typer.Typer) -> None:
    """Run `app` as click's standalone mode would, except that a bad option value reads as our own
    errors do: "Invalid value for '--format': 'nope' is not one of ...", without pydantic's prefix."""
    try:
        code = app(standalone_mode=False)
    except typer.BadParameter as exc:
        exc.message = exc.message.removeprefix(_PYDANTIC_PREFIX)
        exc.show()
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except _click_exception() as exc:  # the other usage errors, shown as click shows them
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(code or 0)
