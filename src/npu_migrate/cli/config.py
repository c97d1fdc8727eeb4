"""Project configuration: `[tool.npu-migrate]` in the target project's pyproject.toml.

Found like ruff finds its settings: the nearest pyproject.toml with a `[tool.npu-migrate]` table, walking
up from the first path given. Command-line options override the file. Unknown keys and bad values are
errors that name the file and the key, never silently ignored.

    [tool.npu-migrate]
    select = ["ALL"]                 # rule ids or prefixes
    ignore = ["NPU104"]
    exclude = ["third_party/*"]      # globs, relative to this file's folder
    torch-npu-version = "2.5.1.post1"
    target = "portable"              # or "npu" (the default): what `apply` migrates to
    torch-version = "2.9.0"          # the portable target's oldest torch to support (default: newest known)
    fused = true                     # or false, or per op: { fused-rms-norm = true, fused-sdpa = true }
    per-file-ignores = { "tests/*" = ["NPU1"] }
    require-clean-git = true         # in-place apply refuses files with uncommitted changes (--force)
    fail-on = "rewrite"              # or "error" / "warning": what else makes `apply` exit 1 (--fail-on)
    min-severity = "warning"         # or "error" / "info": the open findings `apply` prints (--min-severity)
    cache = true                     # keep per-file results in .npu_migrate_cache/ (--no-cache)
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from npu_migrate.findings import SEVERITIES
from npu_migrate.program.api import DEFAULT_TARGET, TARGETS

SECTION = "npu-migrate"

#: `fail-on` thresholds, weakest first: "rewrite" fails `--check` only when a file would change; "error" also
#: on an open finding of severity error; "warning" on one of severity warning or error.
FAIL_ON = ("rewrite", "error", "warning")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    torch_npu_version: str | None = None
    target: str = DEFAULT_TARGET
    torch_version: str | None = None
    fused: bool | dict[str, bool] = True
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    require_clean_git: bool = True
    fail_on: str = "rewrite"
    #: The open findings `apply` prints, this severity or worse; None: the format's default (`--min-severity`).
    min_severity: str | None = None
    cache: bool = True  # answer unchanged files from .npu_migrate_cache/ (`engine/cache.py`)
    path: Path | None = None  # the pyproject.toml it came from

    @property
    def root(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def fused_ignores(self, fused_rule_names: dict[str, str]) -> list[str]:
        """Rule ids to ignore because of `fused` (`fused_rule_names`: rule name -> id)."""
        if self.fused is True:
            return []
        if self.fused is False:
            return list(fused_rule_names.values())
        unknown = sorted(set(self.fused) - set(fused_rule_names))
        if unknown:
            raise ConfigError(
                f"{self.path}: [tool.{SECTION}] fused: unknown op {unknown[0]!r} "
                f"(known: {', '.join(sorted(fused_rule_names))})"
            )
        return [fused_rule_names[name] for name, on in self.fused.items() if not on]

    def fused_opt_ins(self, fused_rule_names: dict[str, str], select: list[str]) -> list[str]:
        """Rule ids `fused = {...}` names true: an opt-in fused rule (NPU707) is selected only so, or by its id.
        Only where `select` (the selection in force) takes in the rule's family (ALL, NPU7, NPU707): the
        switch turns the rule on beside the rest of its family, never against `--select NPU1`."""
        if not isinstance(self.fused, dict):
            return []
        codes = [c.strip().upper() for c in select if c.strip()]
        chosen = [fused_rule_names[name] for name, on in self.fused.items() if on and name in fused_rule_names]
        return [i for i in chosen if any(c == "ALL" or i.startswith(c) for c in codes)]

    def with_fused(
        self, select: list[str], ignore: list[str], fused_rule_names: dict[str, str]
    ) -> tuple[list[str], list[str]]:
        """The selection in force with `fused = ...` applied: its opt-ins added to `select`, its switched-off
        ops added to `ignore`. One place for `apply`, `rules` and `analyze`."""
        return (
            [*select, *self.fused_opt_ins(fused_rule_names, select)],
            [*ignore, *self.fused_ignores(fused_rule_names)],
        )

    def ignored_for(self, display_path: str) -> tuple[str, ...]:
        """Rules `per-file-ignores` switches off for one file (its path relative to the project)."""
        posix = PurePosixPath(display_path)
        codes: list[str] = []
        for pattern, ignored in self.per_file_ignores.items():
            if fnmatch.fnmatch(display_path, pattern) or posix.match(pattern):
                codes.extend(ignored)
        return tuple(codes)


def find_pyproject(paths: list[Path]) -> Path | None:
    start = Path(os.path.abspath(paths[0] if paths else Path.cwd()))
    if not start.is_dir():
        start = start.parent
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{candidate}: cannot read: {exc}") from None
            if SECTION in data.get("tool", {}):
                return candidate
    return None


def _strings(path: Path, key: str, value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.{SECTION}] {key}: expected a list of strings, got {value!r}")
    return tuple(value)


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    # An explicit --config may name anything: a missing file, a folder, bad TOML, a file without the
    # section. Each is a one-line usage error naming the file, never a traceback.
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    tool = document.get("tool")
    if not isinstance(tool, dict) or SECTION not in tool:
        raise ConfigError(f"{path}: no [tool.{SECTION}] section")
    data = tool[SECTION]
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: [tool.{SECTION}] must be a table")
    known = {
        "select",
        "ignore",
        "exclude",
        "torch-npu-version",
        "target",
        "torch-version",
        "fused",
        "per-file-ignores",
        "require-clean-git",
        "fail-on",
        "min-severity",
        "cache",
    }
    for key in data:
        if key not in known:
            raise ConfigError(f"{path}: [tool.{SECTION}] unknown key {key!r} (known keys: {', '.join(sorted(known))})")
    fused = data.get("fused", True)
    if not isinstance(fused, bool) and not (
        isinstance(fused, dict) and all(isinstance(v, bool) for v in fused.values())
    ):
        raise ConfigError(f"{path}: [tool.{SECTION}] fused: expected true, false or a table of op = true/false")
    version = data.get("torch-npu-version")
    if version is not None and not isinstance(version, str):
        raise ConfigError(f'{path}: [tool.{SECTION}] torch-npu-version: expected a string like "2.5.1"')
    target = data.get("target", DEFAULT_TARGET)
    if target not in TARGETS:
        raise ConfigError(f"{path}: [tool.{SECTION}] target: expected one of {', '.join(map(repr, TARGETS))}")
    torch_version = data.get("torch-version")
    if torch_version is not None and not isinstance(torch_version, str):
        raise ConfigError(f'{path}: [tool.{SECTION}] torch-version: expected a string like "2.9.0"')
    per_file = data.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{path}: [tool.{SECTION}] per-file-ignores: expected a table of glob = [rule ids]")
    clean = data.get("require-clean-git", True)
    if not isinstance(clean, bool):
        raise ConfigError(f"{path}: [tool.{SECTION}] require-clean-git: expected true or false")
    fail_on = data.get("fail-on", "rewrite")
    if fail_on not in FAIL_ON:
        raise ConfigError(f"{path}: [tool.{SECTION}] fail-on: expected one of {', '.join(map(repr, FAIL_ON))}")
    min_severity = data.get("min-severity")
    if min_severity is not None and min_severity not in SEVERITIES:
        raise ConfigError(f"{path}: [tool.{SECTION}] min-severity: expected one of {', '.join(map(repr, SEVERITIES))}")
    cache = data.get("cache", True)
    if not isinstance(cache, bool):
        raise ConfigError(f"{path}: [tool.{SECTION}] cache: expected true or false")
    return Config(
        select=_strings(path, "select", data["select"]) if "select" in data else None,
        ignore=_strings(path, "ignore", data.get("ignore", [])),
        exclude=_strings(path, "exclude", data.get("exclude", [])),
        torch_npu_version=version,
        target=target,
        torch_version=torch_version,
        fused=fused,
        per_file_ignores={k: _strings(path, f"per-file-ignores.{k}", v) for k, v in per_file.items()},
        require_clean_git=clean,
        fail_on=fail_on,
        min_severity=min_severity,
        cache=cache,
        path=path,
    )


def discover_config(paths: list[Path], explicit: Path | None = None) -> Config:
    return load_config(explicit if explicit is not None else find_pyproject(paths))


def split_codes(values: list[str] | None) -> list[str]:
    """`--select NPU1,NPU201 --select NPU3` -> ["NPU1", "NPU201", "NPU3"] (also `--exclude`, `--mode`)."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]
