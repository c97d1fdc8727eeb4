"""Guard flips and the code they guard (`npu_migrate.program.guards`, issue #13): a rewrite never sends an NPU
host into code that cannot run there. Every rule is selected, as in a real run; the one-rule cases are
fixtures under `fixtures/rules/` (NPU103 cuda_only_kernel, NPU104 fp8_path and npu_aware, NPU206)."""

from __future__ import annotations

import textwrap

from npu_migrate.engine.pipeline import migrate_text


def _migrate(source: str) -> tuple[str, dict[tuple[int, str], str]]:
    text = textwrap.dedent(source).lstrip()
    migrated, findings = migrate_text(text, path="mod.py")
    again, _ = migrate_text(migrated, path="mod.py")
    assert again == migrated, "a second apply must change nothing"
    messages: dict[tuple[int, str], str] = {}
    for f in findings:  # two findings of one rule on one line: both messages
        key = (f.line, f.rule_id)
        messages[key] = f"{messages[key]} | {f.message}" if key in messages else f.message
    return migrated, messages


def test_a_flag_flipped_in_front_of_a_capability_gate_stands_once_the_gate_is_rewritten():
    migrated, findings = _migrate(
        """
        import torch

        HAS_GPU = torch.cuda.is_available()
        FP16_OK = HAS_GPU and torch.cuda.get_device_capability(0)[0] >= 7
        """
    )
    assert "HAS_GPU = torch.npu.is_available()" in migrated
    assert "FP16_OK = HAS_GPU and (torch.npu.get_device_capability(0) or (8, 0))[0] >= 7" in migrated
    assert "left as is" not in findings[(3, "NPU201")]


def test_a_guard_stays_when_the_code_behind_its_flag_cannot_run_on_an_npu():
    migrated, findings = _migrate(
        """
        import torch

        HAS_GPU = torch.cuda.is_available()


        def arch():
            if HAS_GPU:
                return torch.cuda.get_arch_list()
            return []
        """
    )
    assert "HAS_GPU = torch.cuda.is_available()" in migrated
    assert findings[(3, "NPU201")].startswith(
        "`torch.cuda.is_available()` left as is: the code it guards at line 8 has `torch.cuda.get_arch_list`"
    )
    assert (8, "NPU203") in findings


def test_a_negated_guard_guards_what_follows_an_early_return():
    migrated, findings = _migrate(
        """
        import torch


        def setup():
            if not torch.cuda.is_available():
                return "cpu"
            torch.cuda.set_device(0)
            major = torch.cuda.get_device_properties(0).major
            return major
        """
    )
    assert "if not torch.cuda.is_available():" in migrated
    assert "torch.npu.set_device(0)" in migrated  # runs only where the guard passes: harmless, and right on a GPU
    assert "guards at line 8" in findings[(5, "NPU201")]


def test_unrelated_crashes_elsewhere_do_not_block_a_guard():
    migrated, findings = _migrate(
        """
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        arches = torch.cuda.get_arch_list()
        """
    )
    assert "if torch.npu.is_available():" in migrated
    assert "torch.npu.set_device(0)" in migrated
    assert (5, "NPU203") in findings


def test_a_self_flag_is_followed_through_the_class():
    migrated, findings = _migrate(
        """
        import torch


        class Engine:
            def __init__(self):
                self.use_gpu = torch.cuda.is_available()

            def info(self):
                if self.use_gpu:
                    return torch.cuda.get_device_properties(0).multi_processor_count
                return 0
        """
    )
    assert "self.use_gpu = torch.cuda.is_available()" in migrated
    assert "guards at line 10" in findings[(6, "NPU201")]


def test_a_framework_accelerator_string_keeps_its_guard():
    migrated, findings = _migrate(
        """
        import torch

        if torch.cuda.is_available():
            accelerator = "cuda"
        else:
            accelerator = "cpu"
        """
    )
    assert migrated.startswith("import torch\n\nif torch.cuda.is_available():")
    assert "guards at line 4" in findings[(3, "NPU201")]
    assert "DS_ACCELERATOR=npu" in findings[(4, "NPU105")]


def test_a_guard_imported_from_torch_cuda_keeps_its_import():
    migrated, findings = _migrate(
        """
        from torch.cuda import is_available, synchronize

        if is_available():
            import flash_attn

            flash_attn.flash_attn_func()
        synchronize()
        """
    )
    # The import is split: the guard keeps asking CUDA, `synchronize` moves to the NPU.
    assert migrated.startswith(
        "from torch.cuda import is_available\nimport torch_npu\nfrom torch.npu import synchronize\n"
    )
    assert "if is_available():" in migrated
    # The first line that cannot run on an NPU: the import, before the call.
    assert any("guards code at line 4 that imports flash_attn" in message for message in findings.values())


def test_existing_npu_support_is_left_alone():
    source = """
        import torch


        def synchronize(device):
            if device.type == "npu":
                torch.npu.synchronize()
            elif device.type == "cuda":
                torch.cuda.synchronize()
        """
    migrated, findings = _migrate(source)
    assert migrated == textwrap.dedent(source).lstrip()
    assert list(findings) == [(7, "NPU104")]
    assert "already has an NPU branch" in findings[(7, "NPU104")]


def test_a_cuda_only_kernel_chosen_as_a_value_keeps_its_guard():
    migrated, findings = _migrate(
        """
        import torch.nn.functional as F

        try:
            from flash_attn import flash_attn_func
        except ImportError:
            flash_attn_func = None


        def attention(q, k, v):
            fn = flash_attn_func if q.is_cuda else F.scaled_dot_product_attention
            return fn(q, k, v)
        """
    )
    assert "fn = flash_attn_func if q.is_cuda else" in migrated
    assert "uses `flash_attn_func` from flash_attn" in findings[(10, "NPU103")]


def test_a_fast_path_only_tested_for_presence_keeps_its_is_cuda_guard():
    migrated, findings = _migrate(
        """
        try:
            from my_kernels import fused_norm
        except ImportError:
            fused_norm = None


        def norm(x, weight):
            if fused_norm is not None and x.is_cuda:
                return fused_norm(x, weight)
            return x * weight
        """
    )
    assert "if fused_norm is not None and x.is_cuda:" in migrated
    assert "calls `fused_norm`, a fast path the original runs only on CUDA tensors" in findings[(8, "NPU103")]


def test_a_guard_whose_value_is_returned_stays_when_the_file_has_cuda_only_code():
    migrated, findings = _migrate(
        """
        import torch
        from flash_attn import flash_attn_func


        def has_cuda():
            return torch.cuda.is_available()


        def attention(q, k, v):
            if has_cuda():
                return flash_attn_func(q, k, v)
            return q
        """
    )
    assert "return torch.cuda.is_available()" in migrated
    assert "its value is passed on where it cannot be followed" in findings[(6, "NPU201")]


def test_a_returned_guard_in_a_file_without_cuda_only_code_is_migrated():
    migrated, _ = _migrate(
        """
        import torch


        def has_cuda():
            return torch.cuda.is_available()
        """
    )
    assert "return torch.npu.is_available()" in migrated


def test_a_negated_guard_that_only_sets_an_unrelated_name_guards_nothing_after_it():
    migrated, findings = _migrate(
        """
        import torch


        def arch():
            if not torch.cuda.is_available():
                x = 1
            return torch.cuda.get_arch_list()
        """
    )
    assert "if not torch.npu.is_available():" in migrated
    assert "left as is" not in findings[(5, "NPU201")]


def test_a_flag_set_true_where_cuda_is_missing_guards_the_false_side_of_its_tests():
    migrated, findings = _migrate(
        """
        import torch


        def arch():
            use_cpu = False
            if not torch.cuda.is_available():
                use_cpu = True
            if use_cpu:
                return []
            else:
                return torch.cuda.get_arch_list()
        """
    )
    assert "if not torch.cuda.is_available():" in migrated
    assert "guards at line 11" in findings[(6, "NPU201")]


def test_a_flag_assigned_from_a_negated_guard_guards_the_false_side_of_its_tests():
    migrated, findings = _migrate(
        """
        import torch

        NO_GPU = not torch.cuda.is_available()


        def arch():
            if NO_GPU:
                return []
            return torch.cuda.get_arch_list() if not NO_GPU else None
        """
    )
    assert "NO_GPU = not torch.cuda.is_available()" in migrated
    assert "guards at line 9" in findings[(3, "NPU201")]


def test_a_flag_the_engine_cannot_follow_counts_what_follows():
    migrated, findings = _migrate(
        """
        import torch


        def arch(args):
            if not torch.cuda.is_available():
                args.cpu = True
            return torch.cuda.get_arch_list()
        """
    )
    assert "if not torch.cuda.is_available():" in migrated
    assert "guards at line 7" in findings[(5, "NPU201")]


def test_an_early_return_inside_a_with_block_guards_what_follows_the_block():
    migrated, findings = _migrate(
        """
        import torch


        def arch(lock):
            with lock:
                if not torch.cuda.is_available():
                    return []
                names = []
            for _ in range(2):
                if not torch.cuda.is_available():
                    continue
            return names + torch.cuda.get_arch_list()
        """
    )
    assert "guards at line 12" in findings[(6, "NPU201")]
    # `continue` leaves only the loop: what follows the loop ran on an NPU before the flip as well.
    assert "left as is" not in findings[(10, "NPU201")]


def test_a_module_level_flag_says_its_tests_in_other_modules_are_not_followed():
    migrated, findings = _migrate(
        """
        import torch

        HAS_GPU = torch.cuda.is_available()


        def local():
            ok = torch.cuda.is_available()
            if ok:
                torch.cuda.synchronize()
        """
    )
    assert "HAS_GPU = torch.npu.is_available()" in migrated
    assert findings[(3, "NPU201")].endswith(
        "; `HAS_GPU` is module-level: its tests in other modules are not followed, check that the code they guard "
        "runs on an NPU (`npu-migrate verify --smoke`)"
    )
    assert "module-level" not in findings[(7, "NPU201")]


def test_a_module_level_value_chosen_by_a_guard_is_no_flag_to_warn_about():
    migrated, findings = _migrate(
        """
        import torch

        DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
        """
    )
    assert "torch.npu.is_available()" in migrated
    assert "module-level" not in findings[(3, "NPU201")]


def test_a_guard_stays_in_front_of_an_import_of_a_cuda_only_package():
    # Nothing after the import uses what it binds: the import itself stops an NPU host, where flash_attn does not
    # install. Kept, the guard is False there, and NPU705 has nothing to say about the import.
    migrated, findings = _migrate(
        """
        import torch

        if torch.cuda.is_available():
            from flash_attn.bert_padding import pad_input

        USE_FLASH = torch.cuda.is_available()
        if USE_FLASH:
            import flash_attn
        """
    )
    assert "if torch.cuda.is_available():\n    from flash_attn.bert_padding import pad_input" in migrated
    assert "USE_FLASH = torch.cuda.is_available()" in migrated
    assert findings[(3, "NPU201")] == (
        "`torch.cuda.is_available()` left as is: the code it guards at line 4 imports flash_attn.bert_padding, "
        "which only runs on NVIDIA GPUs; migrate that code, then this test"
    )
    assert "line 8 imports flash_attn" in findings[(6, "NPU201")]
    assert not [key for key in findings if key[1] == "NPU705"]


def test_an_import_of_a_cuda_only_package_in_a_try_does_not_keep_its_guard():
    migrated, findings = _migrate(
        """
        import torch

        if torch.cuda.is_available():
            try:
                from flash_attn.bert_padding import pad_input
            except ImportError:
                pad_input = None
        """
    )
    assert "if torch.npu.is_available():" in migrated
    assert "left as is" not in findings[(3, "NPU201")]


XOPS = """\
import torch

try:
    import xformers.ops as xops
except ImportError:
    xops = None
"""


def test_a_guard_calling_into_xformers_through_the_files_functions_stays_at_any_depth():
    text = XOPS + textwrap.dedent(
        """
        def d(x):
            return xops.memory_efficient_attention(x, x, x)

        def c(x):
            return d(x)

        def b(x):
            return c(x)

        def a(x):
            return b(x)

        def run(x):
            if torch.cuda.is_available():
                return a(x)
            return x
        """
    )
    migrated, findings = _migrate(text)
    assert "if torch.cuda.is_available():" in migrated
    assert any("calls `a`" in message and "which calls `d`" in message for message in findings.values())


def test_a_method_is_followed_in_its_own_class_and_its_subclasses_only():
    text = XOPS + textwrap.dedent(
        """
        class Fast(torch.nn.Module):
            def attend(self, x):
                return xops.memory_efficient_attention(x, x, x)

            def forward(self, x):
                if torch.cuda.is_available():
                    return self.attend(x)
                return x

        class Plain(torch.nn.Module):
            def attend(self, x):
                return x.softmax(-1)

            def forward(self, x):
                if torch.cuda.is_available():
                    return self.attend(x)
                return x

        class Child(Fast):
            def run(self, x):
                if torch.cuda.is_available():
                    return self.attend(x)
                return x
        """
    )
    migrated, _ = _migrate(text)
    # Fast's and Child's (inherited) guards stay; Plain's own attend runs anywhere, so its guard is flipped.
    assert migrated.count("if torch.cuda.is_available():") == 2
    assert migrated.count("if torch.npu.is_available():") == 1
    plain = migrated.index("class Plain")
    assert migrated.index("if torch.npu.is_available():") > plain > migrated.index("class Fast")


def test_a_cuda_only_import_in_an_except_handler_keeps_its_guard():
    # The handler runs where the try's body failed: an NPU host takes it, and apex is not there.
    migrated, messages = _migrate(
        """
        import torch

        try:
            from fused_norms import RMSNorm
        except ImportError:
            if torch.cuda.is_available():
                from apex.normalization import FusedRMSNorm as RMSNorm
            else:
                RMSNorm = torch.nn.LayerNorm
        """
    )
    assert "if torch.cuda.is_available():" in migrated
    assert "imports apex.normalization" in messages[(6, "NPU201")]
