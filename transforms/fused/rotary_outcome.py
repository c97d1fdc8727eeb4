"""NPU703's outcome for one straight-line expression: the branch, or the finding that says why not.

`folded_outcome` takes a function's folded expression (helpers inlined), finds its rotary embeddings
(`rotary_sites`), and answers the branch (`rotary_branch`) when they share one mode that the chosen
torch_npu version's `npu_rotary_mul` applies, else the finding of the first close miss or of the first
decline finder that has one (`rotary_declines`), else None: no rotary embedding there.
"""

from __future__ import annotations

import ast

from npu_migrate.program.api import load_table
from npu_migrate.transforms.fused.rotary_branch import rewrite
from npu_migrate.transforms.fused.rotary_declines import (
    front_dims_outcome,
    rotate_helper_outcome,
    unfollowed_outcome,
    unmatched_rotation,
)
from npu_migrate.transforms.fused.rotary_rule import ROTARY
from npu_migrate.transforms.fused.rotary_sites import sites
from npu_migrate.transforms.fused.rotation import Declined
from npu_migrate.transforms.fused.symbolic import Function, Outcome


def _rotary_modes(fn: Function) -> tuple[bool, bool]:
    """(npu_rotary_mul exists, it takes rotary_mode) in the chosen torch_npu version."""
    if fn.api is None:
        return True, True
    entry = load_table("torch_npu_api.toml")["versions"].get(fn.api.version, {})
    return "npu_rotary_mul" in fn.api.fused_ops, bool(entry.get("rotary_mul_has_rotary_mode", False))


def folded_outcome(fn: Function, result: ast.expr) -> Outcome | None:
    declined: list[Declined] = []
    found = sites(result, fn, declined)
    if not found:
        if declined:
            # dims named from the front (`unflatten(2, ...)`) read as 3-D x: the rewrite counted from the end
            # is proven, so that is the remedy (before the 3-D decline's, which is about per-head tables)
            front = front_dims_outcome(result, fn)
            if front is not None:
                return front
            return Outcome(
                ROTARY,
                f"rotary embedding not fused: {declined[0]}"
                + (", so it is not what npu_rotary_mul computes" if declined[0].differs else ""),
                remedy=declined[0].remedy,
            )
        return (
            unmatched_rotation(result, fn)
            or rotate_helper_outcome(fn)
            or unfollowed_outcome(result, fn)
            or front_dims_outcome(result, fn)
        )
    modes = {s.mode for s in found}
    if len(modes) > 1:
        return Outcome(
            ROTARY,
            "rotary embedding not fused: it mixes half and interleaved rotations",
            remedy="to fuse it, rotate each mode in a function of its own (the kernel applies one mode per call)",
        )
    mode = modes.pop()
    exists, has_mode = _rotary_modes(fn)
    version = fn.api.version if fn.api is not None else "?"
    if not exists:
        return Outcome(
            ROTARY,
            f"rotary embedding not fused: torch_npu {version} has no npu_rotary_mul",
            remedy="to fuse it, target a newer torch_npu (--torch-npu-version)",
        )
    if mode == "interleave" and not has_mode:
        return Outcome(
            ROTARY,
            f"interleaved rotary embedding not fused: npu_rotary_mul in torch_npu {version} has no rotary_mode='interleave'",
            remedy="to fuse it, target a torch_npu that has it (2.1.0.post17 or newer: --torch-npu-version)",
        )
    return rewrite(fn, result, found, mode)
