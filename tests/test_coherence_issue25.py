"""Issue #25: guard flips that still sent an NPU host into CUDA-only code (`npu_migrate.program.guards`). Each
case here was flipped before the fix; the rule is that a guard is flipped only when everything it admits runs
on an NPU, and the tool's own findings on the guarded code count as "does not"."""

from __future__ import annotations

import textwrap

from npu_migrate.engine.pipeline import migrate_text


def _migrate(source: str) -> tuple[str, dict[tuple[int, str], str]]:
    text = textwrap.dedent(source).lstrip()
    migrated, findings = migrate_text(text, path="mod.py")
    again, _ = migrate_text(migrated, path="mod.py")
    assert again == migrated, "a second apply must change nothing"
    messages: dict[tuple[int, str], str] = {}
    for f in findings:
        key = (f.line, f.rule_id)
        messages[key] = f"{messages[key]} | {f.message}" if key in messages else f.message
    return migrated, messages


# -- item 1: what the guard admits ------------------------------------------------------------------------


def test_a_branch_that_warns_and_clears_a_flag_guards_the_flags_later_use():
    migrated, findings = _migrate(
        """
        import warnings
        import torch

        def main(args, x, w):
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
            if args.fp8 and device_type != "cuda":
                warnings.warn("--fp8 needs CUDA, ignored")
                args.fp8 = False
            if args.fp8:
                return torch._scaled_mm(x, w)
            return x @ w
        """
    )
    # device_type is "npu" on an NPU host, so `!= "cuda"` keeps switching fp8 off there.
    assert 'if args.fp8 and device_type != "cuda":' in migrated
    assert findings[(6, "NPU104")].startswith('`device_type != "cuda"` left as is: the code it guards at line 10 ')
    assert "torch._scaled_mm" in findings[(6, "NPU104")]
    assert "is a CUDA-only torch op" in findings[(10, "NPU203")]


def test_an_fp8_switch_whose_else_converts_to_torchao_float8_keeps_its_device_test():
    migrated, findings = _migrate(
        """
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"

        def setup(model, fp8):
            if fp8:
                if device_type != "cuda":
                    print("Warning: FP8 training requires CUDA, ignoring --fp8 flag")
                else:
                    from torchao.float8 import convert_to_float8_training
                    convert_to_float8_training(model)
            return model
        """
    )
    assert 'if device_type != "cuda":' in migrated
    assert "imports torchao.float8, which only runs on NVIDIA GPUs" in findings[(7, "NPU104")]


def test_an_assert_of_cuda_guards_what_follows_it():
    migrated, findings = _migrate(
        """
        import torch
        import bitsandbytes as bnb

        def make_opt(model):
            assert torch.cuda.is_available(), "8-bit Adam requires CUDA"
            return bnb.optim.Adam8bit(model.parameters())
        """
    )
    assert 'assert torch.cuda.is_available(), "8-bit Adam requires CUDA"' in migrated
    assert findings[(5, "NPU201")].startswith(
        "`torch.cuda.is_available()` left as is: the code it guards at line 6 uses `bnb` from bitsandbytes"
    )


def test_an_assert_in_front_of_an_apex_import_stays():
    migrated, findings = _migrate(
        """
        import torch

        def make_opt(model):
            assert torch.cuda.is_available(), "FusedAdam requires CUDA"
            from apex.optimizers import FusedAdam
            return FusedAdam(model.parameters())
        """
    )
    assert "assert torch.cuda.is_available()" in migrated
    assert "imports apex.optimizers" in findings[(4, "NPU201")]


def test_an_assert_with_nothing_cuda_only_after_it_is_flipped():
    migrated, findings = _migrate(
        """
        import torch

        def setup():
            assert torch.cuda.is_available(), "needs a GPU"
            return torch.zeros(2).cuda()
        """
    )
    assert "assert torch.npu.is_available()" in migrated
    assert "left as is" not in findings[(4, "NPU201")]


def test_a_hub_kernel_probe_keeps_its_guard():
    migrated, findings = _migrate(
        """
        import torch

        def load_kernel():
            if torch.cuda.is_available():
                from kernels import get_kernel
                return get_kernel("someone/flash-attn3")
            return None
        """
    )
    assert "if torch.cuda.is_available():" in migrated
    assert "calls `kernels.get_kernel`, which fetches a prebuilt kernel" in findings[(4, "NPU201")]


def test_data_parallel_reported_in_the_guarded_code_keeps_the_guard():
    migrated, findings = _migrate(
        """
        import torch.nn as nn

        class D(nn.Module):
            def forward(self, input):
                if input.is_cuda and self.ngpu > 1:
                    output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
                else:
                    output = self.main(input)
                return output
        """
    )
    assert "if input.is_cuda and self.ngpu > 1:" in migrated
    assert findings[(5, "NPU103")].startswith(
        "`input.is_cuda` left as is: the code it guards at line 6 has `nn.parallel.data_parallel`, which is not "
        "migrated (NPU305)"
    )
    assert (6, "NPU305") in findings


def test_an_availability_chain_whose_default_branch_reaches_data_parallel_stays():
    migrated, findings = _migrate(
        """
        import torch
        import torch.nn as nn

        def wrap(model, args):
            if not torch.cuda.is_available():
                print("using CPU")
            elif args.gpu is not None:
                model = model.cuda(args.gpu)
            else:
                model = nn.DataParallel(model).cuda()
            return model
        """
    )
    assert "if not torch.cuda.is_available():" in migrated
    assert "line 10 has `nn.DataParallel`" in findings[(5, "NPU201")]


# -- item 2: guards that test for a CUDA-only package --------------------------------------------------------


def test_is_cuda_beside_the_imported_function_is_never_flipped():
    migrated, findings = _migrate(
        """
        import torch
        try:
            from flash_attn import flash_attn_func
        except ImportError:
            flash_attn_func = None

        def attn(q, k, v):
            if flash_attn_func is not None and q.is_cuda:
                return flash_attn_func(q, k, v)
            return q
        """
    )
    assert "if flash_attn_func is not None and q.is_cuda:" in migrated
    assert findings[(8, "NPU103")].startswith(
        "`q.is_cuda` left as is: it decides, with `flash_attn_func is not None` (line 8), whether a CUDA-only "
        "package's kernel runs"
    )


def test_is_cuda_beside_a_flag_the_try_import_sets_is_never_flipped_even_returned():
    migrated, findings = _migrate(
        """
        import torch
        try:
            import flash_attn
            HAS_FLASH = True
        except ImportError:
            HAS_FLASH = False

        def usable(x):
            return HAS_FLASH and x.is_cuda

        def attn(q, k, v, impl):
            use_flash = HAS_FLASH
            if use_flash:
                if q.is_cuda:
                    return impl(q, k, v)
            return q
        """
    )
    assert "return HAS_FLASH and x.is_cuda" in migrated
    assert "if q.is_cuda:" in migrated
    assert "with `HAS_FLASH` (line 9)" in findings[(9, "NPU103")]
    assert "with `use_flash` (line 13)" in findings[(14, "NPU103")]


def test_is_cuda_beside_a_transformers_availability_test_is_never_flipped():
    migrated, findings = _migrate(
        """
        import torch
        from transformers.utils import is_flash_attn_2_available

        def attn(q, k, v, core):
            if is_flash_attn_2_available() and q.is_cuda:
                return core(q, k, v)
            return q
        """
    )
    assert "if is_flash_attn_2_available() and q.is_cuda:" in migrated
    assert "with `is_flash_attn_2_available()`" in findings[(5, "NPU103")]


def test_a_remote_code_model_calling_its_flash_submodule_keeps_is_cuda():
    # The flash call sits in another module's forward, reached through an attribute: only the presence
    # test in front of it tells.
    migrated, findings = _migrate(
        """
        import torch
        from torch import nn
        try:
            from flash_attn.flash_attn_interface import flash_attn_unpadded_func
        except ImportError:
            flash_attn_unpadded_func = None

        class Attn(nn.Module):
            def forward(self, query, key, value):
                if self.use_flash_attn and flash_attn_unpadded_func is not None and query.is_cuda:
                    return self.core_attention_flash(query, key, value)
                return query
        """
    )
    assert "flash_attn_unpadded_func is not None and query.is_cuda:" in migrated
    assert "with `flash_attn_unpadded_func is not None` (line 10)" in findings[(10, "NPU103")]


def test_is_cuda_without_a_package_test_is_still_flipped():
    migrated, findings = _migrate(
        """
        import torch

        def pin(x, use_pin):
            if use_pin and x.is_cuda:
                return x.contiguous()
            return x
        """
    )
    assert "if use_pin and x.is_npu:" in migrated


# -- item 4: code that already supports the NPU --------------------------------------------------------------


def test_a_flag_of_npu_aware_code_keeps_the_cuda_branch_it_guards_whole():
    source = """
        import torch

        class Prefetcher:
            def __init__(self, loader, device):
                self.device = device
                if device.type == "npu":
                    self.stream = torch.npu.Stream()
                self.is_cuda = device.type == "cuda" and torch.cuda.is_available()
                if self.is_cuda:
                    self.stream = torch.cuda.Stream()

            def next(self, batch):
                if self.is_cuda:
                    with torch.cuda.stream(self.stream):
                        batch = batch.to(self.device, non_blocking=True)
                return batch
        """
    migrated, findings = _migrate(source)
    # Neither half-migrated (`... and torch.npu.is_available()` in front of CUDA streams) nor silent.
    assert migrated == textwrap.dedent(source).lstrip()
    assert findings[(8, "NPU104")].startswith(
        '`device.type == "cuda"` left as is: `device.type` is also compared with "npu" here'
    )
    assert not [key for key in findings if key[1] == "NPU201"]


def test_a_cuda_test_beside_no_npu_branch_still_migrates_its_code():
    migrated, _ = _migrate(
        """
        import torch

        class Prefetcher:
            def __init__(self, device):
                self.is_cuda = device.type == "cuda" and torch.cuda.is_available()
                if self.is_cuda:
                    self.stream = torch.cuda.Stream()
        """
    )
    assert 'self.is_cuda = device.type == "npu" and torch.npu.is_available()' in migrated
    assert "self.stream = torch.npu.Stream()" in migrated
