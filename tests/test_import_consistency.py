"""Issue #25 item 3: the injected code agrees with the imports it sits next to."""

from __future__ import annotations

import textwrap

from npu_migrate.pipeline import migrate_text

SDPA_AND_MOVE = """
import torch
import torch.nn.functional as F


def attend(q, k, v):
    q = q.cuda()
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""

SDPA_ONLY = """
import torch
import torch.nn.functional as F


def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""


def _migrate(source: str, path: str = "mod.py") -> tuple[str, list]:
    migrated, findings = migrate_text(textwrap.dedent(source).lstrip(), path=path)
    again, second = migrate_text(migrated, path=path)
    assert again == migrated, "a second apply must change nothing"
    # ... and finds no helper of its own "stale": both spellings of `_is_npu` are this version's.
    assert not [f for f in second if "differs from the one npu-migrate" in f.message]
    return migrated, findings


def test_a_file_importing_torch_npu_unconditionally_does_not_test_for_its_absence():
    migrated, _ = _migrate(SDPA_AND_MOVE)
    assert "\nimport torch_npu\n" in migrated
    assert "torch_npu is None" not in migrated
    assert "    if isinstance(x, torch.fx.Proxy):\n        return False" in migrated


def test_a_file_importing_torch_npu_guarded_keeps_the_test():
    migrated, _ = _migrate(SDPA_ONLY)
    assert "except ImportError:  # not an Ascend host: the original code runs\n    torch_npu = None" in migrated
    assert "if torch_npu is None or isinstance(x, torch.fx.Proxy):" in migrated
