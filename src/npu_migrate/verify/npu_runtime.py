"""What the simulated host's `torch.npu` functions do: the documented torch_npu behaviours, on the CPU.

Each public function or class here is the stand-in for the `torch.npu` name it is called by;
`npu_surface` decides which of them a torch_npu version has. Where torch_npu differs from torch.cuda
the difference is kept (../shared/reference/torch_npu_facts.md §0.9, §2.3-2.5):

* `get_device_capability()` returns None; torch_npu >= 2.13 returns (8, 0) when the environment
  variable TORCH_NPU_DEVICE_CAPABILITY is "8.0".
* `get_device_properties()` has name, total_memory, cube_core_num, vector_core_num and L2_cache_size,
  and no major / minor / multi_processor_count (AttributeError, as on the device).
* `torch.npu.matmul.allow_hf32` (default False) and `torch.npu.conv.allow_hf32` (default True) take a
  bool only.

Memory statistics are zeros, streams and events are no-op objects (the CPU runs everything in order),
random numbers come from the CPU generator (an NPU tensor's values live on the CPU).
The device figures (an Ascend 910B2 with 64 GiB) are illustrative, not read from a device.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings

import torch

DEVICE_NAME = "Ascend910B2"
TOTAL_MEMORY = 64 * 1024**3
CAPABILITY_ENV = "TORCH_NPU_DEVICE_CAPABILITY"


class Runtime:
    """The host's device state: how many NPUs, which one is current, the HF32 switches."""

    def __init__(self, device_count: int = 1, capability_from_env: bool = False) -> None:
        if device_count < 1:
            raise ValueError(f"device_count must be at least 1, got {device_count}")
        self.device_count = device_count
        #: torch_npu >= 2.13 reads TORCH_NPU_DEVICE_CAPABILITY; older versions always return None.
        self.capability_from_env = capability_from_env
        self.current = 0
        self.memory_fraction = 1.0
        self.sync_debug_mode = 0

    def index(self, device=None, *, optional: bool = True) -> int:
        """The device index meant by `device` (None, an int, "npu", "npu:1", a torch.device)."""
        if device is None:
            return self.current
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "npu":
                raise ValueError(f"Expected a npu device, but got: {device}")
            index = self.current if device.index is None else device.index
        elif isinstance(device, int) and not isinstance(device, bool):
            index = device
        else:
            raise ValueError(f"Invalid device argument: {device!r}")
        if not 0 <= index < self.device_count:
            raise RuntimeError(
                f"Invalid device ID {index}: the simulated NPU host has {self.device_count} device(s) "
                "(npu_migrate.verify.npu_host.install(device_count=...))"
            )
        return index


# -- devices ---------------------------------------------------------------------------------------------


class DeviceProperties:
    """torch_npu's `_NPUDeviceProperties`: no major / minor / multi_processor_count."""

    __slots__ = ("name", "total_memory", "cube_core_num", "vector_core_num", "L2_cache_size")

    def __init__(self) -> None:
        self.name = DEVICE_NAME
        self.total_memory = TOTAL_MEMORY
        self.cube_core_num = 24
        self.vector_core_num = 48
        self.L2_cache_size = 192 * 1024**2

    def __repr__(self) -> str:
        return (
            f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // 1024**2}MB, "
            f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num}, "
            f"L2_cache_size={self.L2_cache_size // 1024**2}MB)"
        )


def device_functions(rt: Runtime) -> dict:
    def set_device(device) -> None:
        rt.current = rt.index(device)

    def get_device_capability(device=None):
        rt.index(device)
        if rt.capability_from_env:
            value = os.environ.get(CAPABILITY_ENV, "")
            major, dot, minor = value.partition(".")
            if dot and major.isdigit() and minor.isdigit():
                return int(major), int(minor)
        return None

    def get_device_properties(device=None) -> DeviceProperties:
        rt.index(device)
        return DeviceProperties()

    def get_device_name(device=None) -> str:
        rt.index(device)
        return DEVICE_NAME

    def mem_get_info(device=None) -> tuple[int, int]:
        rt.index(device)
        return TOTAL_MEMORY, TOTAL_MEMORY

    def can_device_access_peer(device, peer) -> bool:
        return rt.index(device) != rt.index(peer)

    def synchronize(device=None) -> None:
        rt.index(device)

    def utilization(device=None) -> int:
        rt.index(device)
        return 0

    def set_per_process_memory_fraction(fraction, device=None) -> None:
        rt.index(device)
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        rt.memory_fraction = fraction

    def set_sync_debug_mode(debug_mode) -> None:
        modes = {"default": 0, "warn": 1, "error": 2}
        rt.sync_debug_mode = modes[debug_mode] if isinstance(debug_mode, str) else int(debug_mode)

    class device:  # noqa: N801 - torch.npu.device, a context manager like torch.cuda.device
        def __init__(self, device) -> None:
            self.idx = -1 if device is None else rt.index(device)
            self.prev_idx = -1

        def __enter__(self):
            self.prev_idx = rt.current
            if self.idx >= 0:
                rt.current = self.idx
            return self

        def __exit__(self, *exc) -> bool:
            rt.current = self.prev_idx
            return False

    class device_of(device):  # noqa: N801
        def __init__(self, obj) -> None:
            super().__init__(obj.get_device() if obj.device.type == "npu" else -1)

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "device_count": lambda: rt.device_count,
        "current_device": lambda: rt.current,
        "set_device": set_device,
        "device": device,
        "device_of": device_of,
        "synchronize": synchronize,
        "get_device_capability": get_device_capability,
        "get_device_properties": get_device_properties,
        "get_device_name": get_device_name,
        "mem_get_info": mem_get_info,
        "can_device_access_peer": can_device_access_peer,
        "utilization": utilization,
        "is_bf16_supported": lambda *args, **kwargs: True,
        "set_per_process_memory_fraction": set_per_process_memory_fraction,
        "get_per_process_memory_fraction": lambda device=None: rt.memory_fraction,
        "set_sync_debug_mode": set_sync_debug_mode,
        "get_sync_debug_mode": lambda: rt.sync_debug_mode,
    }


# -- memory (nothing is allocated on a device: every statistic is zero) -----------------------------------

_STAT_NAMES = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
    "allocation",
    "segment",
    "active",
    "inactive_split",
)
_POOLS = ("all", "small_pool", "large_pool")
_COUNTERS = ("current", "peak", "allocated", "freed")


def memory_stats_as_nested_dict(device=None) -> dict:
    stats: dict = {name: {pool: dict.fromkeys(_COUNTERS, 0) for pool in _POOLS} for name in _STAT_NAMES}
    stats.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, max_split_size=-1)
    return stats


def memory_stats(device=None) -> dict:
    flat = {}
    for name, value in memory_stats_as_nested_dict(device).items():
        if isinstance(value, dict):
            for pool, counters in value.items():
                for counter, n in counters.items():
                    flat[f"{name}.{pool}.{counter}"] = n
        else:
            flat[name] = value
    return dict(sorted(flat.items()))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    return "simulated NPU host: no device memory is allocated (all statistics are 0)\n"


def memory_functions() -> dict:
    def zero(device=None) -> int:
        return 0

    def nothing(*args, **kwargs) -> None:
        return None

    functions = {name: zero for name in _ZERO_MEMORY}
    functions.update({name: nothing for name in _RESET_MEMORY})
    functions.update(
        memory_stats=memory_stats,
        memory_stats_as_nested_dict=memory_stats_as_nested_dict,
        memory_summary=memory_summary,
        memory_snapshot=lambda *args, **kwargs: [],
    )
    return functions


_ZERO_MEMORY = (
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
)
_RESET_MEMORY = (
    "empty_cache",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
)


# -- streams and events (the CPU runs every op in order: waiting is always done) --------------------------


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        return 0.0


class Stream:
    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.priority = priority

    @property
    def device(self) -> torch.device:
        return torch.device("npu", 0)

    def wait_event(self, event) -> None:
        return None

    def wait_stream(self, stream) -> None:
        return None

    def record_event(self, event=None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


_DEFAULT_STREAM = Stream()


def stream_functions() -> dict:
    current = [_DEFAULT_STREAM]

    def set_stream(stream) -> None:
        if stream is not None:
            current[0] = stream

    class StreamContext:
        def __init__(self, stream) -> None:
            self.stream = stream
            self.previous = None

        def __enter__(self):
            self.previous = current[0]
            set_stream(self.stream)
            return self.stream

        def __exit__(self, *exc) -> bool:
            current[0] = self.previous
            return False

    return {
        "Stream": Stream,
        "Event": Event,
        "StreamContext": StreamContext,
        "stream": StreamContext,
        "set_stream": set_stream,
        "current_stream": lambda device=None: current[0],
        "default_stream": lambda device=None: _DEFAULT_STREAM,
    }


# -- random numbers (NPU tensors are filled by the CPU generator) ------------------------------------------


def random_functions(rt: Runtime) -> dict:
    def manual_seed(seed) -> None:
        torch.default_generator.manual_seed(int(seed))

    def seed() -> None:
        torch.default_generator.seed()

    return {
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "seed": seed,
        "seed_all": seed,
        "initial_seed": lambda: torch.default_generator.initial_seed(),
        "get_rng_state": lambda device="npu": torch.get_rng_state(),
        "set_rng_state": lambda new_state, device="npu": torch.set_rng_state(new_state),
        "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(rt.device_count)],
        "set_rng_state_all": lambda new_states: torch.set_rng_state(list(new_states)[0]),
        "default_generators": (torch.default_generator,) * rt.device_count,
    }


# -- autocast and AMP ------------------------------------------------------------------------------------


def autocast_functions() -> dict:
    return {
        "get_amp_supported_dtype": lambda: [torch.float16, torch.bfloat16],
        "is_autocast_enabled": lambda: torch.is_autocast_enabled("npu"),
        "set_autocast_enabled": lambda enabled: torch.set_autocast_enabled("npu", enabled),
        "get_autocast_dtype": lambda: torch.get_autocast_dtype("npu"),
        "set_autocast_dtype": lambda dtype: torch.set_autocast_dtype("npu", dtype),
    }


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 - torch.npu.amp.autocast
    """torch_npu's `torch.npu.amp.autocast`: torch.amp's autocast on "npu", float16 by default."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch_npu's `torch.npu.amp.GradScaler`: torch.amp's scaler on "npu", with the extra `dynamic=`."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        dynamic: bool = True,
    ) -> None:
        if not dynamic:
            growth_factor, backoff_factor = 1.0, 1.0  # a static loss scale never moves
        super().__init__("npu", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
        self.dynamic = dynamic


def amp_functions() -> dict:
    def deprecated(decorator, name):
        @functools.wraps(decorator)
        def wrapper(*args, **kwargs):
            warnings.warn(
                f"torch.npu.amp.{name}(args...) is deprecated. Please use torch.amp.{name}(args..., "
                "device_type='npu') instead.",
                FutureWarning,
                stacklevel=2,
            )
            return decorator(*args, device_type="npu", **kwargs)

        return wrapper

    return {
        "autocast": autocast,
        "GradScaler": GradScaler,
        "custom_fwd": deprecated(torch.amp.custom_fwd, "custom_fwd"),
        "custom_bwd": deprecated(torch.amp.custom_bwd, "custom_bwd"),
    }


# -- backend switches ------------------------------------------------------------------------------------


class Hf32Switch:
    """`torch.npu.matmul` / `torch.npu.conv`: `allow_hf32` is a bool, like torch_npu's setter requires."""

    def __init__(self, default: bool) -> None:
        self._allow_hf32 = default

    @property
    def allow_hf32(self) -> bool:
        return self._allow_hf32

    @allow_hf32.setter
    def allow_hf32(self, value) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"allow_hf32 expects a bool, got {type(value).__name__}")
        self._allow_hf32 = value


class FftPlanCache:
    """`torch.npu.backends.fft_plan_cache`: settable `max_size`, never holds a plan."""

    def __init__(self) -> None:
        self.max_size = 0

    @property
    def size(self) -> int:
        return 0

    def clear(self) -> None:
        return None


def sdp_functions() -> dict:
    """torch_npu's SDPA switches only flip torch's global flags (and warn): the same here."""
    sdp = torch.backends.cuda
    return {
        name: getattr(sdp, name)
        for name in (
            "flash_sdp_enabled",
            "enable_flash_sdp",
            "mem_efficient_sdp_enabled",
            "enable_mem_efficient_sdp",
            "math_sdp_enabled",
            "enable_math_sdp",
        )
    } | {
        "sdp_kernel": lambda *args, **kwargs: contextlib.nullcontext(),
        "preferred_linalg_library": lambda backend=None: torch._C._LinalgBackend.Default,
    }


# -- mstx (torch_npu's nvtx) -------------------------------------------------------------------------------


class mstx:  # noqa: N801 - torch.npu.mstx is a class in torch_npu
    """Markers and ranges for the Ascend profiler: recorded nowhere on the simulated host."""

    _next_id = 0

    @staticmethod
    def mark(message: str = "", stream=None, domain: str = "default") -> None:
        return None

    @staticmethod
    def range_push(message: str = "", domain: str = "default") -> int:
        return 0

    @staticmethod
    def range_pop(domain: str = "default") -> int:
        return 0

    @staticmethod
    def range_start(message: str = "", stream=None, domain: str = "default") -> int:
        mstx._next_id += 1
        return mstx._next_id

    @staticmethod
    def range_end(range_id: int, domain: str = "default") -> None:
        return None

    @staticmethod
    def mstx_range(message: str = "", stream=None, domain: str = "default"):
        return annotate(message)


class annotate(contextlib.ContextDecorator):  # noqa: N801 - torch_npu.npu.mstx.annotate
    def __init__(self, message: str = "", stream=None, domain: str = "default") -> None:
        self.message = message

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


class NpuConfig:
    """`torch.npu.config`: `allow_internal_format` (the "ALLOW_INTERNAL_FORMAT" option) takes a bool; the
    CPU has no private formats, so it is only remembered."""

    def __init__(self) -> None:
        self.allow_internal_format = True


def compile_functions() -> dict:
    """`torch.npu.set_compile_mode` (prebuilt operator binaries or online compilation) and `torch.npu.config`:
    the CPU compiles nothing, so the mode is only remembered (`is_jit_compile_false`)."""
    mode = {"jit_compile": True}

    def set_compile_mode(jit_compile=False) -> None:
        mode["jit_compile"] = bool(jit_compile)

    def is_jit_compile_false() -> bool:
        return not mode["jit_compile"]

    return {"set_compile_mode": set_compile_mode, "is_jit_compile_false": is_jit_compile_false, "config": NpuConfig()}
