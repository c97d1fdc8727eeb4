"""Calls into CUDA-only packages in the heavy-operator ranking and the per-package advice: by what the symbol
computes (attention, a SwiGLU, a loss), never by the package alone: `flash_attn.__version__.split` is no
attention operator, and xformers' SwiGLU and cross-entropy get no attention advice."""

from __future__ import annotations

import json

from test_analyze import run_analyze

SOURCE = """\
import flash_attn
import torch
from flash_attn import flash_attn_func
from flash_attn.bert_padding import pad_input
from xformers.ops import SwiGLU, cross_entropy, memory_efficient_attention

MAJOR = int(flash_attn.__version__.split(".")[0])


def step(q, k, v, x, target, indices):
    out = flash_attn_func(q, k, v, causal=True)
    other = memory_efficient_attention(q, k, v)
    ffn = SwiGLU(64, 128)
    loss = cross_entropy(ffn(x), target)
    return pad_input(out, indices, 2, 16), other, loss
"""


def _analyse(tmp_path) -> dict:
    (tmp_path / "step.py").write_text(SOURCE)
    result = run_analyze(tmp_path, "--mode", "all", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_only_what_a_package_computes_is_ranked_and_by_its_kind(tmp_path):
    operators = _analyse(tmp_path)["results"]["model"]["data"]["operators"]
    ranked = {(o["kind"], o["operator"]): o["ascend"] for o in operators}
    assert set(ranked) == {
        ("attention", "flash_attn.flash_attn_func"),
        ("attention", "xformers.ops.memory_efficient_attention"),
        ("activation", "xformers.ops.SwiGLU"),
        ("loss", "xformers.ops.cross_entropy"),
    }
    assert ranked[("attention", "flash_attn.flash_attn_func")] == (
        "not available: flash_attn is CUDA-only (use torch_npu.npu_fusion_attention)"
    )
    assert ranked[("activation", "xformers.ops.SwiGLU")] == (
        "not available: xformers.ops.SwiGLU is CUDA-only (use torch_npu.npu_swiglu)"
    )
    assert [o["kind"] for o in operators][:2] == ["attention", "attention"]  # cost order: attention first


def test_package_advice_fits_the_symbol(tmp_path):
    packages = _analyse(tmp_path)["results"]["third_party"]["data"]["packages"]
    advice = {row[1]: row[4] for row in packages}
    assert "npu_fusion_attention" in advice["xformers.ops.memory_efficient_attention"]
    assert "npu_swiglu" in advice["xformers.ops.SwiGLU"]
    assert "cross_entropy" in advice["xformers.ops.cross_entropy"]
    for symbol in ("xformers.ops.SwiGLU", "xformers.ops.cross_entropy", "flash_attn.bert_padding.pad_input"):
        # The attention advice's marks: the fused kernel's layout and its inverted mask.
        assert "input_layout" not in advice[symbol] and "True means masked" not in advice[symbol]
