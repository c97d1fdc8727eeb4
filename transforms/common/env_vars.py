"""The environment-variable table (`data/env_vars.toml`): what each CUDA variable needs on Ascend.

Python code and launch scripts, Dockerfiles, .env and YAML files read it alike, so one place says what
`CUDA_VISIBLE_DEVICES` becomes.
"""

from __future__ import annotations

import re
from enum import Enum

from npu_migrate.files import kinds
from npu_migrate.program.api import load_table

_TABLE = load_table("env_vars.toml")
_RENAME: dict[str, str] = _TABLE["rename"]
_CONVERT: dict[str, str] = _TABLE["convert"]
_NO_EQUIVALENT: dict[str, str] = _TABLE["no_equivalent"]
_PREFIXES: dict[str, str] = _TABLE["prefixes"]
_CHECKS: dict[str, str] = _TABLE["checks"]
_ASCENDING_IDS = re.compile(r"\d+(,\d+)*")

#: The variables the table names in full, and the prefixes of families of variables it advises on.
NAMED = frozenset({*_RENAME, *_CONVERT, *_NO_EQUIVALENT})
PREFIXES = tuple(_PREFIXES)
_VARIABLES = NAMED | frozenset(_CHECKS)


class Need(Enum):
    """What a variable that is not simply renamed needs on Ascend."""

    CONVERSION = "convert"  # its value is written differently
    NO_EQUIVALENT = "no_equivalent"  # nothing on Ascend reads it


def verdict(name: str) -> tuple[str | None, Need | None, str]:
    """What variable `name` needs on Ascend, for every file kind: (new name, need, advice).

    A plain rename gives (new, None, ""); a value to convert or a variable without counterpart gives
    (None, need, advice); a name npu-migrate has nothing to say about gives (None, None, "").
    """
    if name in _RENAME:
        return _RENAME[name], None, ""
    if name in _CONVERT:
        return None, Need.CONVERSION, _CONVERT[name]
    if name in _NO_EQUIVALENT:
        return None, Need.NO_EQUIVALENT, _NO_EQUIVALENT[name]
    prefix = next((p for p in sorted(_PREFIXES, key=len, reverse=True) if name.startswith(p)), None)
    if prefix is not None:
        return None, Need.NO_EQUIVALENT, _PREFIXES[prefix]
    return None, None, ""


def known_variable(name: str) -> bool:
    """Whether `verdict` or `visible_devices_problem` can have something to say about variable `name`."""
    return name in _VARIABLES or name.startswith(PREFIXES)


def visible_devices_problem(name: str, value: str) -> str | None:
    """Why `value` for variable `name` (after renaming) would select other devices on Ascend, if it would."""
    if _CHECKS.get(_RENAME.get(name, name)) == "ascending-ids" and not _ascending_ids(value):
        return (
            f"{_RENAME.get(name, name)} needs comma-separated device ids in ascending order without spaces, and "
            f"stops reading at the first one that breaks this: {value!r} would select other devices than on "
            "CUDA. Sort the ids (and remap code that relies on their order)"
        )
    return None


def _ascending_ids(value: str) -> bool:
    if not _ASCENDING_IDS.fullmatch(value):
        return False
    ids = [int(part) for part in value.split(",")]
    return ids == sorted(set(ids))


def both_spellings(name: str, new: str, kind: str) -> str:
    """The portable target's advice for a variable Ascend reads under another name: a script that must serve
    CUDA and Ascend hosts keeps `name` and sets `new` from it where the host has not set it already."""
    how = {
        kinds.PYTHON: f'os.environ.setdefault("{new}", os.environ["{name}"])',
        kinds.SHELL: f'export {new}="${{{new}:-${name}}}"',
        kinds.DOCKERFILE: f"ENV {new}=${{{new}:-${name}}}",
    }.get(kind, f"{new} set to the same value")
    return (
        f"`{name}` left as is for CUDA hosts; an Ascend host reads `{new}`: set it as well, where the host has "
        f"not set it, after this one: `{how}`"
    )
