"""How a rule's example shows the fused-op helpers its rewrite adds: folded into one line naming them.

The helpers a fused rewrite writes after a file's imports run to a hundred lines and more (`apply --diff`
shows them); in `npu-migrate rules NPU704` they would bury the call site the example is about, and tie
every example to the helpers' text. `Example.after` holds the line instead, and the documentation test
compares it with the engine's real output folded the same way (`fold_helpers`), so an example still fails
where the rewrite of the call site, or the list of helpers it adds, changes.
"""

from __future__ import annotations

import ast

from npu_migrate.engine.lines import first_line
from npu_migrate.transforms.common.guarded_import import is_guarded_import
from npu_migrate.transforms.fused import is_helper
from npu_migrate.transforms.fused.helpers import parse_typed

#: The line an example shows in place of the helpers; `{}` names what they are.
FOLDED_HELPERS = "# ... fused-op helpers npu-migrate adds here: {}"
#: How the line names the prelude's guarded `import torch_npu`.
GUARDED = "import torch_npu (guarded)"


def fold_helpers(text: str) -> str:
    """`text`, the engine's output, as an example shows it: its block of helpers folded into one line.
    Text with no `_is_npu` (every block of helpers defines it) is not even parsed: a shell script, say."""
    if "def _is_npu(" not in text:
        return text
    block = helper_block(parse_typed(text))
    if block is None:
        return text
    first, last, names = block
    lines = text.splitlines(keepends=True)
    return "".join([*lines[: first - 1], FOLDED_HELPERS.format(", ".join(names)) + "\n", *lines[last:]])


def helper_block(tree: ast.Module) -> tuple[int, int, list[str]] | None:
    """The first run of module-level statements of `tree` (parsed by `parse_typed`) that the helpers write
    after the imports (the prelude's guarded `import torch_npu`, the helper templates' definitions as this
    version writes them) and that defines a helper: its first and last line, and the guarded import (as
    `GUARDED`) and the defs and classes in it, in order."""
    run: list[ast.stmt] = []
    for stmt in [*tree.body, None]:
        if stmt is not None and (is_guarded_import(stmt) or is_helper(stmt)):
            run.append(stmt)
            continue
        held = [
            GUARDED if is_guarded_import(s) else s.name for s in run if not isinstance(s, (ast.Assign, ast.AnnAssign))
        ]
        if any(name != GUARDED for name in held):
            return first_line(run[0]), run[-1].end_lineno, held
        run = []
    return None
