"""npu-migrate: move a PyTorch code base from NVIDIA GPUs to Huawei Ascend NPUs (torch_npu).

The tool is static: it never imports torch or torch_npu to rewrite or analyse code.
"""

__version__ = "0.1.0"
