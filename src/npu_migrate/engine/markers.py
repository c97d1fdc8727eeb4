"""The words without which no rule of `apply` can match a Python file: the start-up gate.

Every checker of Python files declares `markers` (`checkers.PythonChecker`): substrings of which a file
must hold at least one for that checker to run. The engine asks this union first, before it imports the
checkers, so that a file holding none of them (`x = 1`, a pre-commit run over files that never mention a
GPU) costs no import of libcst and of the rules. It is a list of its own because reading it from the
checkers would import them; tests/test_prefilter.py checks that each checker's markers contain one of
these, so the gate can only let through more files than the checkers want, never fewer.
"""

from __future__ import annotations

ANY_MARKER = (
    "cuda",
    "autocast",
    "GradScaler",
    "custom_fwd",
    "custom_bwd",
    "cudnn",
    "sdpa_kernel",
    "ProfilerActivity",
    "nccl",
    "NCCL",
    "Backend",
    "is_backend_available",
    "init_process_group",
    "new_group",
    "new_subgroups",
    "DeviceMesh",
    "init_device_mesh",
    "DataParallel",
    "data_parallel",
    "env",
    "CUDAExtension",
    "cpp_extension",
    "load_inline",
    "torch_npu",  # the portable target's NPU002: code already written for torch_npu
    # torch's CUDA-only ops (`transforms/cuda_only_ops.py`)
    "_scaled_mm",
    "_scaled_grouped_mm",
    "_cslt_sparse_mm",
    "int4pack",
    # a required CUDA-only package (`transforms/requirements.py`; "flash_attn" is below)
    "xformers",
    "apex",
    "bitsandbytes",
    "optim",  # the training levers: fused optimizers (NPU411, NPU412)
    "__main__",  # an entry point's start-up switches (NPU511)
    "compile",  # torch.compile (NPU512)
    "pin_memory",  # the DataLoader's pinned memory (NPU106)
    "backward",  # host-device syncs in a training loop (NPU107)
    # (and "apex" above) apex's amp and CUDA fused classes (NPU421, NPU422)
    # the fused-operator idioms (`transforms/fused/*`, `Idiom.markers`)
    "sqrt",
    "rms_norm",
    "RMSNorm",
    "normalize",
    "silu",
    "SiLU",
    "act_fn",
    "activation_fn",
    "ACT2FN",
    "self.act(",  # an activation attribute bound to a constructor argument (NPU702)
    "self.activation(",
    "cos",
    "sin",
    "rotate",
    "rotary",
    "rope",
    "view_as_complex",
    "polar",
    "scaled_dot_product_attention",
    "flash_attn",
    "softmax",
    "Softmax",  # an `nn.Softmax(dim=-1)` module called on attention scores (NPU704)
)


def may_match(text: str) -> bool:
    """Whether some checker of Python files may run on `text`."""
    return any(marker in text for marker in ANY_MARKER)
