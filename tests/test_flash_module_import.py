"""Issue #25 item 5: a flash-attn wrapper must not need flash-attn to exist on the NPU path, whatever the import
spelling; FlashAttention-3's calls are reported, not left silent."""

from __future__ import annotations

import textwrap

from npu_migrate.engine.pipeline import migrate_text


def _migrate(source: str):
    text = textwrap.dedent(source).lstrip()
    migrated, findings = migrate_text(text, path="mod.py")
    again, _ = migrate_text(migrated, path="mod.py")
    assert again == migrated, "a second apply must change nothing"
    messages: dict[tuple[int, str], str] = {}
    for f in findings:  # two findings of one rule on one line: both messages
        key = (f.line, f.rule_id)
        messages[key] = f"{messages[key]} | {f.message}" if key in messages else f.message
    return migrated, messages


def test_a_call_through_the_module_reads_its_function_only_where_the_module_imported():
    migrated, findings = _migrate(
        """
        import flash_attn
        import torch


        def attend(q, k, v, cu, n):
            return flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=True)
        """
    )
    assert "try:\n    import flash_attn\nexcept ImportError:" in migrated
    assert "    flash_attn = None  # the calls take torch_npu's kernel" in migrated
    assert "flash_attn and flash_attn.flash_attn_varlen_func," in migrated
    assert "`import flash_attn` made conditional" in findings[(1, "NPU705")]


def test_the_module_import_stays_where_something_else_reads_the_module():
    migrated, findings = _migrate(
        """
        import flash_attn
        import torch

        VERSION = flash_attn.__version__


        def attend(q, k, v):
            return flash_attn.flash_attn_func(q, k, v, causal=True)
        """
    )
    assert migrated.startswith("import flash_attn\n")
    assert "_npu_flash_attn_func(\n        flash_attn.flash_attn_func, q, k, v, causal=True\n    )" in migrated
    assert "`import flash_attn` left unconditional: line 4 uses `flash_attn`" in findings[(1, "NPU705")]


def test_an_import_finding_quotes_the_names_as_the_statement_spells_them():
    # The finding quotes the line it points at: an alias it dropped would leave `fa` named nowhere in it.
    _, findings = _migrate(
        """
        import flash_attn as fa
        import torch

        VERSION = fa.__version__


        def attend(q, k, v):
            return fa.flash_attn_func(q, k, v, causal=True)
        """
    )
    assert "`import flash_attn as fa` left unconditional: line 4 uses `fa`" in findings[(1, "NPU705")]


def test_flash_attention_3_calls_are_reported_with_the_port():
    migrated, findings = _migrate(
        """
        import torch
        import flash_attn_interface


        def attend(q, k, v):
            return flash_attn_interface.flash_attn_func(q, k, v, causal=True)
        """
    )
    assert "flash_attn_interface.flash_attn_func(q, k, v, causal=True)" in migrated
    message = findings[(6, "NPU705")]
    assert message.startswith("`flash_attn_interface.flash_attn_func` (FlashAttention-3) not rewritten")
    assert "npu_fusion_attention" in message
