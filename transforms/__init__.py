"""The rules, one module per family. Each module declares its `Rule`s and the `Checker` that finds them.

Rule id ranges: NPU0xx engine-level edits, NPU1xx device placement and the data pipeline (NPU106,
NPU107), NPU2xx torch.cuda APIs, NPU3xx torch.distributed, NPU4xx automatic mixed precision and the
optimizer step (NPU41x torch_npu's fused optimizers, NPU42x apex), NPU5xx torch.backends, the profiler and
the start-up switches (NPU51x), NPU6xx environment variables and launch scripts (NPU606 Ascend's training
performance variables), NPU7xx fused-operator injection, NPU8xx custom CUDA kernels.
"""

from npu_migrate.transforms.amp import AmpChecker
from npu_migrate.transforms.apex import ApexChecker
from npu_migrate.transforms.backends import BackendsChecker
from npu_migrate.transforms.cuda_api import CudaApiChecker
from npu_migrate.transforms.cuda_only_ops import CudaOnlyOpChecker
from npu_migrate.transforms.data_pipeline import DataPipelineChecker
from npu_migrate.transforms.device import DeviceChecker
from npu_migrate.transforms.distributed import DistributedChecker
from npu_migrate.transforms.environment import EnvironmentChecker
from npu_migrate.transforms.fused import FusedOpsChecker
from npu_migrate.transforms.kernels import CudaExtensionChecker, CudaSourceChecker
from npu_migrate.transforms.launch import LaunchChecker
from npu_migrate.transforms.launch_env import LaunchEnvChecker
from npu_migrate.transforms.optimizers import OptimizerChecker
from npu_migrate.transforms.requirements import RequiredPackageChecker
from npu_migrate.transforms.startup import StartupChecker
from npu_migrate.transforms.torch_npu_import import NpuCodeChecker, TorchNpuImportChecker

CHECKERS = (
    TorchNpuImportChecker,
    DeviceChecker,
    DataPipelineChecker,
    CudaApiChecker,
    CudaOnlyOpChecker,
    DistributedChecker,
    AmpChecker,
    ApexChecker,
    BackendsChecker,
    EnvironmentChecker,
    FusedOpsChecker,
    OptimizerChecker,
    StartupChecker,
    CudaExtensionChecker,
    RequiredPackageChecker,
    NpuCodeChecker,
)

#: Checkers of files without a Python syntax tree: launch scripts, Dockerfiles, .env, YAML, CUDA sources.
TEXT_CHECKERS = (LaunchChecker, LaunchEnvChecker, CudaSourceChecker)
