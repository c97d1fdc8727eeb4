"""`npu-migrate verify`: run the original and the migrated code side by side and compare the outputs.

The fused branches that `npu-migrate apply` injects only run on an NPU. Off one, the migrated process
runs them on `reference`, a CPU model of the torch_npu ops that also enforces the ops' constraints.
"""

from npu_migrate.verify.harness import (
    ModuleReport,
    OutputReport,
    VerifyReport,
    VerifyUsageError,
    compare,
)

__all__ = ["ModuleReport", "OutputReport", "VerifyReport", "VerifyUsageError", "compare"]
