"""Jupyter notebooks: the code cells are migrated as one Python module, outputs and metadata untouched.

Cells are joined with marker comments so that names imported in one cell resolve in the next (an
`import torch` in cell 1 makes `torch.cuda.synchronize()` in cell 5 a torch API), migrated by the Python
pipeline, and split back. IPython magics (`%timeit`, `!nvidia-smi`) are not Python: they are masked with
placeholders for the migration and restored verbatim. The JSON is written back with the file's own
indentation, so the diff touches only the changed source lines (and `git apply` accepts it).
"""

from __future__ import annotations

import json
import re

from npu_migrate.files.source import SourceError

CELL_MARKER = "# <npu-migrate cell {}>"
_MARKER = re.compile(r"^# <npu-migrate cell (\d+)>\n", re.M)
_MAGIC = re.compile(r"^([ \t]*)([%!?].*)$", re.M)
_PLACEHOLDER = "pass  # <npu-migrate magic {}>"
_PLACEHOLDER_LINE = re.compile(r"pass  # <npu-migrate magic (\d+)>")


def load(text: str, display: str) -> dict:
    try:
        notebook = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"invalid notebook JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise SourceError("not a Jupyter notebook (no list of cells)")
    return notebook


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def join_cells(notebook: dict) -> tuple[str, list[int], list[str]]:
    """One module from the code cells: (module text, indexes of the code cells, masked magic lines)."""
    parts, indexes, magics = [], [], []

    def mask(match: re.Match) -> str:
        magics.append(match.group(2))
        return match.group(1) + _PLACEHOLDER.format(len(magics) - 1)

    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "code":
            continue
        indexes.append(index)
        body = _MAGIC.sub(mask, _cell_source(cell))
        parts.append(CELL_MARKER.format(index) + "\n" + body + ("" if body.endswith("\n") else "\n"))
    return "".join(parts), indexes, magics


def split_cells(module: str, indexes: list[int], magics: list[str], notebook: dict) -> dict[int, str]:
    """The migrated source of each code cell, by cell index; raises if the markers did not survive."""
    module = _PLACEHOLDER_LINE.sub(lambda m: magics[int(m.group(1))], module)
    pieces = _MARKER.split(module)
    # pieces: [text before the first marker, index, body, index, body, ...]
    if pieces[0].strip() or [int(i) for i in pieces[1::2]] != indexes:
        raise SourceError("internal error: notebook cells could not be separated after migration; left untouched")
    sources = {}
    for index, body in zip(indexes, pieces[2::2]):
        original = _cell_source(notebook["cells"][index])
        sources[index] = body if original.endswith("\n") else body[:-1] if body.endswith("\n") else body
    return sources


def indentation(text: str) -> int | None:
    match = re.search(r"^\{\s*\n( +)\"", text)
    return len(match.group(1)) if match else None


def dump(notebook: dict, sources: dict[int, str], original_text: str) -> str:
    """The notebook with new cell sources, serialised the way the file was (indent, ASCII escaping)."""
    for index, source in sources.items():
        cell = notebook["cells"][index]
        if _cell_source(cell) == source:
            continue
        cell["source"] = source.splitlines(keepends=True) if isinstance(cell.get("source"), list) else source
    ensure_ascii = not re.search(r"[^\x00-\x7f]", original_text) and "\\u" in original_text
    text = json.dumps(notebook, indent=indentation(original_text), ensure_ascii=ensure_ascii)
    return text + ("\n" if original_text.endswith("\n") else "")


def validate(text: str) -> None:
    """The result is still a notebook: valid JSON, and nbformat-valid where nbformat is installed."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"internal error: the migrated notebook is not valid JSON ({exc.msg}); left untouched"
        ) from None
    try:
        import nbformat
    except ImportError:  # nbformat is optional; JSON validity is the guarantee without it
        return
    try:
        nbformat.validate(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
    except nbformat.ValidationError as exc:
        raise SourceError(
            f"internal error: the migrated notebook is not valid ({exc.message}); left untouched"
        ) from None


def cell_lines(module: str) -> list[tuple[int, int]]:
    """For each line of the joined module (1-based, index 0 unused): (cell index, line within the cell)."""
    mapping = [(-1, 0)]
    cell, line_in_cell = -1, 0
    for line in module.splitlines():
        marker = _MARKER.match(line + "\n")
        if marker:
            cell, line_in_cell = int(marker.group(1)), 0
            mapping.append((cell, 0))
            continue
        line_in_cell += 1
        mapping.append((cell, line_in_cell))
    return mapping
