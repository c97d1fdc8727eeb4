"""`npu-migrate verify`: run the original and the migrated code side by side and compare the outputs.

The fused branches that `npu-migrate apply` injects only run on an NPU. Off one, the migrated process
runs them on `reference`, a CPU model of the torch_npu ops that also enforces the ops' constraints.
"""

__all__ = ["ModuleReport", "OutputReport", "VerifyReport", "VerifyUsageError", "compare"]


def __getattr__(name: str):
    # The harness is loaded on first use, not when the CLI registers `verify` on every run.
    if name in __all__:
        from npu_migrate.verify import harness

        return getattr(harness, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
