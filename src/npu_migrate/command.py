"""How every `npu-migrate` command presents its help: plain click formatting (no rich: faster start-up, and
examples keep their layout), and arguments shown by their metavar rather than a Python type (`<list[Path]>`)."""

from __future__ import annotations

import functools
import sys

import typer
from typer.core import TyperArgument, TyperCommand, TyperOption

#: The Typer settings every app of ours uses: `-h` as well as `--help`, and no rich formatting.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


class Command(TyperCommand):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):
                param.display_type_rich = _no_type
                param._usage_display_name = functools.partial(_usage_name, param)
            elif isinstance(param, TyperOption) and param.metavar is None:
                param.display_type_rich = functools.partial(_plain_metavar, param)


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
