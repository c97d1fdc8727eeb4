"""The guarded `import torch_npu` that the portable target (NPU001) and the fused branches' prelude both
write, in the same words, so that a file needing both has one import, which each recognises."""

from __future__ import annotations

import ast

#: The portable target's import: torch_npu makes an Ascend NPU torch's accelerator where it is installed, and
#: the code must still import on a CUDA or CPU host without it. The fused branches' prelude imports it in the
#: same words, so a file that needs both has one import, which each recognises (`is_guarded_import`).
GUARDED_IMPORT = """\
try:
    import torch_npu
except ImportError:  # not an Ascend host: the original code runs
    torch_npu = None
"""


def is_guarded_import(stmt: ast.stmt) -> bool:
    """`try: import torch_npu / except ImportError: torch_npu = None` at module level."""
    return (
        isinstance(stmt, ast.Try)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], ast.Import)
        and [(a.name, a.asname) for a in stmt.body[0].names] == [("torch_npu", None)]
        and len(stmt.handlers) == 1
        and isinstance(stmt.handlers[0].type, ast.Name)
        and stmt.handlers[0].type.id == "ImportError"
    )
