"""The rules, one module per family. Each module declares its `Rule`s and the `Checker` that finds them.

Rule id ranges: NPU0xx engine-level edits, NPU1xx device placement, NPU2xx torch.cuda APIs.
"""

from npu_migrate.transforms.cuda_api import CudaApiChecker
from npu_migrate.transforms.device import DeviceChecker
from npu_migrate.transforms.torch_npu_import import TorchNpuImportChecker

CHECKERS = (TorchNpuImportChecker, DeviceChecker, CudaApiChecker)
