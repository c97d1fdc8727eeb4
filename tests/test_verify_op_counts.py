"""Issue #23 part 3: `npu-migrate verify` counts the operators each side dispatches (`verify/op_counts.py`).

Counted at the dispatcher, by family; a CPU reference kernel is one fused call, never the CPU operators
that model it. Each count below is exact, and each check is shown failing when what it guards is broken:
the reference kernel counted by its internals, a view counted as a kernel, a fused branch that no longer
runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_migrate.verify import op_counts, reference

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "fused_package"


def _hand_written_rms_norm(x, weight, eps=1e-6):
    h = x.float()
    variance = h.pow(2).mean(-1, keepdim=True)
    return weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)


def _count(fn, *args, **kwargs) -> dict:
    with torch.no_grad(), op_counts.counting() as counter:
        fn(*args, **kwargs)
    return counter.to_dict()


X = torch.randn(2, 3, 8, dtype=torch.bfloat16)
W = torch.ones(8, dtype=torch.bfloat16)


def test_a_hand_written_rms_norm_dispatches_eight_ops_and_the_reference_kernel_one_fused_call():
    original = _count(_hand_written_rms_norm, X, W)
    assert original["by_op"] == {
        "aten._to_copy": 2,
        "aten.add": 1,
        "aten.mean": 1,
        "aten.mul": 2,
        "aten.pow": 1,
        "aten.rsqrt": 1,
    }
    assert original["families"] == {"copy / layout": 2, "elementwise": 5, "reduction": 1}
    assert original["ops"] == original["kernels"] == 8 and original["fused"] == {}

    migrated = _count(reference.torch_npu_module().npu_rms_norm, X, W, epsilon=1e-6)
    assert migrated == {
        "ops": 1,
        "kernels": 1,
        "families": {op_counts.FUSED_FAMILY: 1},
        "by_op": {},
        "fused": {"npu_rms_norm": 1},
    }


def test_the_reference_kernel_counted_by_its_cpu_ops_would_be_caught():
    # The same kernel without `fused_call` (what a reference op that skipped it would do): its CPU ops
    # are counted, no fused call is, and the assertion above fails.
    broken = _count(reference.OPS["npu_rms_norm"], X, W, epsilon=1e-6)
    assert broken["ops"] > 1 and broken["fused"] == {}


def test_the_reference_kernels_backward_is_one_fused_call_too():
    x, w = torch.randn(2, 3, 8, requires_grad=True), torch.ones(8, requires_grad=True)
    npu = reference.torch_npu_module()
    with op_counts.counting() as counter:
        npu.npu_rms_norm(x, w, epsilon=1e-6)[0].sum().backward()
    counts = counter.to_dict()
    assert counts["fused"] == {"npu_rms_norm": 1, "npu_rms_norm_backward": 1}
    # Only what is not the kernel's: sum, its backward (ones_like, expand), and the autograd engine's
    # accumulation of gradients (between nodes, which no node hook covers).
    assert set(counts["by_op"]) <= {"aten.sum", "aten.ones_like", "aten.expand", "aten.add", "aten.add_", "aten.detach"}
    assert x.grad is not None and w.grad is not None  # the hooks did not stop the gradients
    # Counted without the hooks, the reference's own gradient ops would show (what the assertions catch).
    x.grad = w.grad = None
    with op_counts.counting() as plain:
        reference.OPS["npu_rms_norm"](x, w, epsilon=1e-6)[0].sum().backward()
    assert plain.fused == {} and sum(plain.ops.values()) > sum(counter.ops.values()) + 5


def test_a_fused_call_outside_counting_counts_nothing_and_nesting_restores_counting():
    with op_counts.fused_call("npu_swiglu"):  # no counter: a plain call (tests, smoke runs)
        pass
    with torch.no_grad(), op_counts.counting() as counter:
        with op_counts.fused_call("npu_swiglu"):
            torch.ones(3) + 1  # inside: not counted
        torch.ones(3) + 1  # after it: counted again
    assert counter.to_dict()["by_op"] == {"aten.add": 1, "aten.ones": 1}
    assert counter.fused == {"npu_swiglu": 1}


def test_a_real_torch_npu_kernel_counts_as_a_fused_call():
    """On an NPU the kernels reach the dispatcher as `npu::` ops: modelled by an op of that namespace."""
    lib = torch.library.Library("npu", "FRAGMENT")
    try:
        lib.define("npu_migrate_test_kernel(Tensor x) -> Tensor")
        lib.impl("npu_migrate_test_kernel", lambda x: x.clone(), "CompositeExplicitAutograd")
        counts = _count(torch.ops.npu.npu_migrate_test_kernel, torch.ones(2))
    finally:
        lib._destroy()
    assert counts["fused"] == {"npu_migrate_test_kernel": 1}
    assert counts["families"] == {op_counts.FUSED_FAMILY: 1} and counts["by_op"] == {}


def test_views_are_counted_apart_and_are_not_kernels():
    counts = _count(lambda x: x.transpose(0, 1).unsqueeze(0) * 2, torch.randn(2, 3))
    assert counts["by_op"] == {"aten.mul": 1, "aten.transpose": 1, "aten.unsqueeze": 1}
    assert counts["families"] == {"elementwise": 1, "view": 2}
    assert (counts["ops"], counts["kernels"]) == (3, 1)


def test_families_of_the_ops_a_decoder_dispatches():
    ops = torch.ops.aten
    assert op_counts.family(ops.mm.default) == "matmul"
    assert op_counts.family(ops._softmax.default) == "softmax"
    assert op_counts.family(ops._scaled_dot_product_flash_attention_for_cpu.default) == "attention"
    assert op_counts.family(ops.silu.default) == "activation"
    assert op_counts.family(ops.rsqrt.default) == "elementwise"
    assert op_counts.family(ops.mean.dim) == "reduction"
    assert op_counts.family(ops.t.default) == "view"
    assert op_counts.family(ops.embedding.default) == "indexing"


def test_the_table_shows_each_family_the_totals_and_the_fused_calls():
    original = _count(_hand_written_rms_norm, X, W)
    migrated = _count(reference.torch_npu_module().npu_rms_norm, X, W, epsilon=1e-6)
    lines = op_counts.table(original, migrated)
    assert lines[0].split() == ["original", "migrated"]
    assert any(line.split()[:4] == ["elementwise", "5", "0", "-5"] for line in lines)
    assert any(line.split()[:6] == ["kernels", "(no", "views)", "8", "1", "-7"] for line in lines)
    assert lines[-1] == "  fused calls in their place: 1 (npu_rms_norm x1)"


# -- through `npu-migrate verify` -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = tmp_path_factory.mktemp("op_counts")
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECT, original)
    done = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(original), "--output", str(migrated)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return original, migrated


def test_verify_reports_the_operator_counts_of_both_sides(trees):
    from npu_migrate.verify.harness import compare

    original, migrated = trees
    report = compare(original, migrated, migrated / "factory.py", min_cosine=0.99, dtype="bfloat16")
    assert report.passed, report.to_text()
    before, after = report.op_counts["original"], report.op_counts["migrated"]
    # The fused calls counted at the dispatcher are the ones the reference module counted.
    assert after["fused"] == report.fused_calls and sum(after["fused"].values()) == 13
    assert before["fused"] == {} and op_counts.FUSED_FAMILY not in before["families"]
    assert after["families"][op_counts.FUSED_FAMILY] == 13
    # What the fused kernels replaced: every reduction (the norms' means) and the activations.
    assert before["families"]["reduction"] == 5 and "reduction" not in after["families"]
    assert after["kernels"] < before["kernels"] and after["ops"] < before["ops"]
    text = report.to_text()
    assert "operators dispatched per forward pass, by family (counted at the dispatcher):" in text
    assert "fused calls in their place: 13 (" in text
    assert report.to_dict()["op_counts"] == report.op_counts


def test_a_factory_with_a_loss_gets_the_counts_of_a_training_step(trees, tmp_path):
    from npu_migrate.verify.harness import compare

    original, migrated = trees
    factory = tmp_path / "factory.py"
    # The model returns its loss as a tensor: `loss(output)` tells verify what to differentiate.
    factory.write_text((migrated / "factory.py").read_text() + "\n\ndef loss(output):\n    return output\n")
    report = compare(original, migrated, factory, min_cosine=0.99, dtype="float32")
    assert report.passed, report.to_text()
    step = report.op_counts["migrated training step"]
    forward = report.op_counts["migrated"]["fused"]
    # Every fused call of the forward again, and the backward of each (13 + 13).
    assert step["fused"] == {**forward, **{f"{op}_backward": n for op, n in forward.items()}}
    assert step["kernels"] < report.op_counts["original training step"]["kernels"]
    assert report.fused_calls == forward  # the per-module calls stay the forward's
    assert "operators dispatched per training step (forward, loss, backward)" in report.to_text()


def test_a_fused_branch_that_no_longer_runs_shows_in_the_counts(trees, tmp_path):
    """The norms' branch switched off: 5 fewer fused calls, and the norms' own ops back on the migrated side."""
    from npu_migrate.verify.harness import compare

    original, migrated = trees
    broken = tmp_path / "broken"
    shutil.copytree(migrated, broken)
    norms = broken / "fusedpkg" / "norms.py"
    text = norms.read_text()
    assert text.count("_is_npu(hidden_states)") == 1
    norms.write_text(text.replace("_is_npu(hidden_states)", "False and _is_npu(hidden_states)"))
    good = compare(original, migrated, migrated / "factory.py", min_cosine=0.99, dtype="bfloat16")
    bad = compare(original, broken, broken / "factory.py", min_cosine=0.99, dtype="bfloat16")
    assert bad.op_counts["migrated"]["fused"].get("npu_rms_norm", 0) == 0
    assert sum(bad.op_counts["migrated"]["fused"].values()) == sum(good.op_counts["migrated"]["fused"].values()) - 5
    assert bad.op_counts["migrated"]["families"]["reduction"] == 5
    assert bad.op_counts["migrated"]["kernels"] > good.op_counts["migrated"]["kernels"]
