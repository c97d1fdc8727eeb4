"""Which kind of file a path is, and so which part of the engine migrates it."""

from __future__ import annotations

from pathlib import Path

PYTHON = "python"
NOTEBOOK = "notebook"
SHELL = "shell"
DOCKERFILE = "dockerfile"
DOTENV = "env"
YAML = "yaml"
CUDA_SOURCE = "cuda"

_SUFFIXES = {
    ".py": PYTHON,
    ".ipynb": NOTEBOOK,
    ".sh": SHELL,
    ".bash": SHELL,
    ".env": DOTENV,
    ".yaml": YAML,
    ".yml": YAML,
    ".cu": CUDA_SOURCE,
    ".cuh": CUDA_SOURCE,
}
#: Kinds edited as text, token by token, rather than through a syntax tree.
TEXT_KINDS = frozenset({SHELL, DOCKERFILE, DOTENV, YAML, CUDA_SOURCE})


def kind_of(path: Path) -> str | None:
    name = path.name
    if name == "Dockerfile" or name.startswith("Dockerfile.") or name.endswith(".dockerfile"):
        return DOCKERFILE
    if name == ".env" or name.startswith(".env."):
        return DOTENV
    return _SUFFIXES.get(path.suffix.lower())
