"""What a run shows and leaves behind: the findings, diffs, summary and machine-readable documents (`report`),
the hunk-by-hunk review (`interactive`), the fused-op helper module a package gets (`helper_module`), and a
rule's example as `npu-migrate rules` prints it (`rule_examples`). A new output format starts in `report`."""
