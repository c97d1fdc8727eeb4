"""Hand-curated knowledge behind ``transforms/data/torch_accelerator.toml``.

``scripts/generate_accelerator_tables.py`` reads *which names exist* in each
torch release from the wheels; what no wheel can say is which generic API does
the same job as a ``torch.cuda`` name, and what each call does on a host
without an accelerator.  That judgement lives here, as plain data, so that the
generator stays an extractor and a reviewer can read every claim in one place.

Every claim is checked somewhere: the generator refuses a ``torch.cuda`` name
that has no entry (or an entry for a name torch no longer has) and computes
each counterpart's first version from the wheels; ``tests/test_accelerator_table.py``
calls the originals and counterparts on the installed CPU torch to check
``needs_guard`` and the CPU-build column of ``NO_ACCELERATOR``.
"""

from __future__ import annotations

from dataclasses import dataclass

# A counterpart spelled with this prefix is looked up on the module of the
# current device (torch.cuda, torch.npu, torch.xpu, ... or torch.cpu when
# there is no accelerator) rather than on a device-generic API.
DEVICE_MODULE = "torch.get_device_module()."


@dataclass(frozen=True)
class Counterpart:
    """What a ``torch.cuda`` name becomes in device-generic code.

    ``target`` is a dotted name (``torch.accelerator.synchronize``), a
    ``DEVICE_MODULE`` lookup, or ``None`` when nothing generic does the same
    job.  ``fallback`` is what to use on torch versions older than the
    target's first version.  ``needs_guard`` is true when, on a host without
    accelerator, the ``torch.cuda`` original returns quietly but the
    counterpart raises, so a rewrite must keep a ``torch.accelerator.is_available()``
    guard (or the original) around it.
    """

    target: str | None
    note: str = ""
    fallback: str = ""
    needs_guard: bool = False


def _none(note: str) -> Counterpart:
    return Counterpart(None, note)


def _device_module(name: str, note: str = "", needs_guard: bool = False) -> Counterpart:
    return Counterpart(DEVICE_MODULE + name, note, needs_guard=needs_guard)


_POSITIONAL_DEVICE = (
    "the device argument is positional-only (`f(device=d)` is a TypeError: pass it positionally); "
    "a torch.device or str must match the current accelerator's type (`'cuda'` raises on an NPU host)"
)
_MEMORY_GUARD = (
    "on a CPU-only build it raises RuntimeError ('Cannot access accelerator device when none is available') "
    "where torch.cuda returns quietly: keep an is_available() guard"
)
_DEVICE_MODULE_CPU = "torch.cpu has no such name, so without an accelerator get_device_module() lookups fail"


def _memory(name: str, target: str | None = None, extra: str = "", needs_guard: bool = True) -> Counterpart:
    note = "; ".join(part for part in (extra, _POSITIONAL_DEVICE, _MEMORY_GUARD if needs_guard else "") if part)
    return Counterpart(target or f"torch.accelerator.{name}", note, DEVICE_MODULE + name, needs_guard)


_LEGACY_TYPE = (
    "legacy typed tensor/storage class with no generic spelling: "
    "use torch.empty(..., dtype=..., device=<accelerator device>) or .to(<accelerator device>)"
)

_TYPED_CLASSES = [
    f"{prefix}{suffix}"
    for prefix in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
    for suffix in ("Storage", "Tensor")
] + ["ComplexDoubleStorage", "ComplexFloatStorage"]

# One entry per name of torch.cuda.__all__ in the reference torch, plus the
# private memory-history helpers that profiling code calls by name.
CUDA_COUNTERPARTS: dict[str, Counterpart] = {
    **{name: _none(_LEGACY_TYPE) for name in _TYPED_CLASSES},
    "CUDAGraph": Counterpart(
        "torch.accelerator.Graph",
        "Graph(keep_graph=False, *, pool=None, capture_error_mode='default') takes pool and capture_error_mode "
        "at construction, not in capture_begin(), and its default mode is the backend's, not CUDA's 'global'; "
        "it wraps the backend's graph through torch._C._acceleratorGraph, "
        "and whether torch_npu implements that interface is unverified",
    ),
    "CUDAPluggableAllocator": _none("backend-specific allocator class (torch_npu: torch.npu.NPUPluggableAllocator)"),
    "CudaError": _none(
        "CUDA runtime error class; torch.AcceleratorError (2.8+) is what device errors raise generically"
    ),
    "DeferredCudaCallError": _none("CUDA lazy-initialisation error class"),
    "Event": Counterpart(
        "torch.Event",
        "torch.Event(device=None, *, enable_timing=False, blocking=False, interprocess=False): the flags are "
        "keyword-only (torch.cuda.Event(True) must become torch.Event(enable_timing=True)) and there is no "
        "`external` flag; record() on a CPU-only build raises",
    ),
    "ExternalStream": _none("wraps a raw CUDA stream pointer"),
    "GreenContext": _none("CUDA green contexts (SM partitioning)"),
    "MemPool": _device_module("MemPool", "the allocator argument is backend-specific"),
    "Stream": Counterpart(
        "torch.Stream",
        "torch.Stream(device=None, *, priority=0): priority is keyword-only (second positional in torch.cuda.Stream) "
        "and there is no stream_ptr; a torch.Stream is a context manager from 2.7 (`with stream:`); "
        "no .cuda_stream attribute",
    ),
    "StreamContext": _device_module("StreamContext", "or `with stream:` on a torch.Stream (2.7+)"),
    "amp": Counterpart(
        "torch.amp",
        "torch.cuda.amp.autocast(...) -> torch.amp.autocast(<device type>, ...); GradScaler(...) -> "
        "torch.amp.GradScaler(<device type>, ...), whose device defaults to 'cuda', so always pass it; "
        "custom_fwd/custom_bwd take a keyword-only device_type=; torch.amp has GradScaler from 2.3 and "
        "custom_fwd/custom_bwd from 2.4 (see [introduced])",
    ),
    "caching_allocator_alloc": _device_module("caching_allocator_alloc"),
    "caching_allocator_delete": _device_module("caching_allocator_delete"),
    "caching_allocator_disabled": _none("CUDA caching-allocator switch"),
    "caching_allocator_enable": _none("CUDA caching-allocator switch"),
    "can_device_access_peer": _device_module("can_device_access_peer"),
    "change_current_allocator": _device_module("change_current_allocator", "takes a backend-specific allocator"),
    "check_error": _none("checks a raw cudaError_t code"),
    "clock_rate": _none("NVML query"),
    "cudaStatus": _none("CUDA status codes"),
    "cudart": _none("the CUDA runtime library handle (torch_npu has a different npurt())"),
    "current_blas_handle": _device_module("current_blas_handle"),
    "current_device": Counterpart(
        "torch.accelerator.current_device_index",
        "renamed; both raise without an accelerator",
    ),
    "current_solver_handle": _none("cuSOLVER handle"),
    "current_stream": Counterpart(
        "torch.accelerator.current_stream",
        f"{_POSITIONAL_DEVICE}; returns a generic torch.Stream (no .cuda_stream)",
    ),
    "default_generators": _device_module("default_generators"),
    "default_stream": _device_module("default_stream"),
    "device": Counterpart(
        "torch.accelerator.device_index",
        "context manager that takes an int index or None only (torch.cuda.device also takes a torch.device or str)",
        DEVICE_MODULE + "device",
    ),
    "device_count": Counterpart("torch.accelerator.device_count", "counts the current accelerator's devices"),
    "device_memory_used": _none("NVML query"),
    "device_of": _device_module("device_of"),
    "empty_cache": _memory(
        "empty_cache",
        extra="a no-op until the allocator is initialised, like torch.cuda.empty_cache",
    ),
    "get_allocator_backend": _device_module("get_allocator_backend"),
    "get_arch_list": _none("CUDA compute architectures the build targets"),
    "get_device_capability": _none(
        "not torch.accelerator.get_device_capability: that one (2.10+) returns a dict ({'supported_dtypes': ...}) "
        "and CUDA did not implement it in 2.11; torch.npu.get_device_capability returns None unless "
        "TORCH_NPU_DEVICE_CAPABILITY is set, so `>= (8, 0)` checks need a per-device decision"
    ),
    "get_device_name": _device_module("get_device_name"),
    "get_device_properties": _device_module(
        "get_device_properties",
        "the properties object is backend-specific (major/minor/multi_processor_count are CUDA fields)",
    ),
    "get_gencode_flags": _none("CUDA compiler flags of the build"),
    "get_per_process_memory_fraction": _device_module("get_per_process_memory_fraction"),
    "get_rng_state": Counterpart(
        "torch.accelerator.random.get_rng_state",
        f"{_POSITIONAL_DEVICE}; defaults to the current device (torch.cuda's default is 'cuda')",
        DEVICE_MODULE + "get_rng_state",
    ),
    "get_rng_state_all": Counterpart(
        "torch.accelerator.random.get_rng_state_all", fallback=DEVICE_MODULE + "get_rng_state_all"
    ),
    "get_stream_from_external": _none("wraps a raw CUDA stream pointer"),
    "get_sync_debug_mode": _device_module("get_sync_debug_mode"),
    "graph": _device_module(
        "graph",
        "takes the backend's graph object (torch.npu.graph takes an NPUGraph); "
        "a torch.accelerator.Graph (2.12+) is itself the capture context manager",
    ),
    "graph_pool_handle": _device_module("graph_pool_handle"),
    "graphs": _device_module("graphs"),
    "has_half": _none("CUDA build flag (always True)"),
    "has_magma": _none("CUDA build flag"),
    "host_memory_stats": _device_module("host_memory_stats", _DEVICE_MODULE_CPU, needs_guard=True),
    "host_memory_stats_as_nested_dict": _device_module(
        "host_memory_stats_as_nested_dict", _DEVICE_MODULE_CPU, needs_guard=True
    ),
    "init": _device_module("init"),
    "initial_seed": Counterpart(
        "torch.accelerator.random.initial_seed", _POSITIONAL_DEVICE, DEVICE_MODULE + "initial_seed"
    ),
    "ipc_collect": _device_module("ipc_collect"),
    "is_available": Counterpart(
        "torch.accelerator.is_available",
        "true for whichever accelerator is present (NPU with torch_npu, CUDA, XPU, MPS on macOS...), "
        "not only CUDA; the same result as torch.cuda.is_available() on a CUDA host",
    ),
    "is_bf16_supported": _device_module("is_bf16_supported", _DEVICE_MODULE_CPU, needs_guard=True),
    "is_current_stream_capturing": _device_module("is_current_stream_capturing"),
    "is_initialized": _device_module(
        "is_initialized",
        "torch.cpu has it from 2.8 and it returns True there, where torch.cuda.is_initialized() returns False "
        "without a GPU: code that branches on it changes path",
    ),
    "is_tf32_supported": _none("CUDA TF32 capability query"),
    "jiterator": _none("CUDA runtime kernel compiler"),
    "list_gpu_processes": _none("NVML query"),
    "make_graphed_callables": _device_module("make_graphed_callables"),
    "manual_seed": _device_module(
        "manual_seed",
        f"{_DEVICE_MODULE_CPU}; torch.manual_seed would also reseed the CPU generator, which changes results",
        needs_guard=True,
    ),
    "manual_seed_all": _device_module(
        "manual_seed_all",
        f"{_DEVICE_MODULE_CPU}; torch.manual_seed would also reseed the CPU generator, which changes results",
        needs_guard=True,
    ),
    "max_memory_allocated": _memory("max_memory_allocated"),
    "max_memory_cached": _memory(
        "max_memory_cached", "torch.accelerator.max_memory_reserved", "deprecated alias of max_memory_reserved"
    ),
    "max_memory_reserved": _memory("max_memory_reserved"),
    "mem_get_info": _memory(
        "mem_get_info",
        "torch.accelerator.get_memory_info",
        "renamed; returns (free, total) bytes as before",
        needs_guard=False,
    ),
    "memory": Counterpart(
        "torch.accelerator.memory",
        "the generic module has only the statistics functions, not the allocator or memory-history tools",
    ),
    "memory_allocated": _memory("memory_allocated"),
    "memory_cached": _memory(
        "memory_cached", "torch.accelerator.memory_reserved", "deprecated alias of memory_reserved"
    ),
    "memory_reserved": _memory("memory_reserved"),
    "memory_snapshot": _device_module("memory_snapshot"),
    "memory_stats": _memory("memory_stats"),
    "memory_stats_as_nested_dict": _device_module("memory_stats_as_nested_dict", _DEVICE_MODULE_CPU, needs_guard=True),
    "memory_summary": _device_module("memory_summary"),
    "memory_usage": _none("NVML query"),
    "nccl": _none("use torch.distributed with get_default_backend_for_device()"),
    "nvtx": _none("NVTX ranges; torch.profiler.record_function is the profiler-level generic (torch_npu: mstx)"),
    "power_draw": _none("NVML query"),
    "profiler": _none("cudaProfilerStart/Stop; use torch.profiler"),
    "random": Counterpart(
        "torch.accelerator.random",
        "the generic module has only initial_seed, get_rng_state and get_rng_state_all",
    ),
    "reset_accumulated_host_memory_stats": _device_module("reset_accumulated_host_memory_stats"),
    # On a CPU-only build torch.cuda itself raises here, so the generic call adds no new failure.
    "reset_accumulated_memory_stats": _memory("reset_accumulated_memory_stats", needs_guard=False),
    "reset_max_memory_allocated": _memory(
        "reset_max_memory_allocated",
        "torch.accelerator.reset_peak_memory_stats",
        "deprecated; resets every peak statistic, as torch.cuda's does",
        needs_guard=False,
    ),
    "reset_max_memory_cached": _memory(
        "reset_max_memory_cached",
        "torch.accelerator.reset_peak_memory_stats",
        "deprecated; resets every peak statistic, as torch.cuda's does",
        needs_guard=False,
    ),
    "reset_peak_host_memory_stats": _device_module("reset_peak_host_memory_stats"),
    "reset_peak_memory_stats": _memory("reset_peak_memory_stats", needs_guard=False),
    "seed": _device_module("seed", _DEVICE_MODULE_CPU, needs_guard=True),
    "seed_all": _device_module("seed_all", _DEVICE_MODULE_CPU, needs_guard=True),
    "set_device": Counterpart(
        "torch.accelerator.set_device_index",
        "renamed; the argument is positional-only (int, or a torch.device/str with an index of the current "
        "accelerator's type); a negative index is a no-op in both",
    ),
    "set_per_process_memory_fraction": _device_module("set_per_process_memory_fraction"),
    "set_rng_state": _device_module("set_rng_state"),
    "set_rng_state_all": _device_module("set_rng_state_all"),
    "set_stream": Counterpart(
        "torch.accelerator.set_stream",
        "takes a torch.Stream of the current accelerator's type and also makes its device current; "
        "torch.cuda.set_stream(None) is a no-op, the generic one is not",
    ),
    "set_sync_debug_mode": _device_module("set_sync_debug_mode"),
    "sparse": _none("cuSPARSE helpers"),
    "stream": _device_module("stream", "or `with stream:` on a torch.Stream (2.7+)"),
    "streams": _device_module("streams"),
    "synchronize": Counterpart("torch.accelerator.synchronize", _POSITIONAL_DEVICE),
    "temperature": _none("NVML query"),
    "tunable": _none("TunableOp (CUDA/ROCm GEMM tuning)"),
    "use_mem_pool": _device_module("use_mem_pool"),
    "utilization": _device_module("utilization"),
    "memory._record_memory_history": _none("private CUDA memory-history recorder"),
    "memory._snapshot": _none(
        "private; torch.accelerator.memory._snapshot (2.13+, private too) reads what the backend's own "
        "_record_memory_history recorded"
    ),
    "memory._dump_snapshot": _none("private CUDA memory-history dump"),
}

# How calls behave on a host without an accelerator.  `cpu_build` is checked by
# tests/test_accelerator_table.py against the installed CPU torch.
# `cuda_build_without_gpu` was observed once on torch 2.11.0+cu130 with
# CUDA_VISIBLE_DEVICES="" on a GPU machine; "" where that run did not try it.
# An outcome is "returns <repr>" for None/bool/int/empty containers, "returns <type>"
# for other values, or "raises <exception type>".
NO_ACCELERATOR_OBSERVED_ON = "2.11.0+cu130"


@dataclass(frozen=True)
class NoAccelerator:
    cpu_build: str
    cuda_build_without_gpu: str
    note: str = ""


NO_ACCELERATOR: dict[str, NoAccelerator] = {
    "torch.accelerator.current_accelerator()": NoAccelerator(
        "returns None",
        "returns torch.device",
        "2.6 raises RuntimeError on any host without a usable device; from 2.7 it reports the accelerator the "
        "build was compiled with, so a CUDA build on a machine without GPU returns device('cuda'): "
        "pass check_available=True to get None there",
    ),
    "torch.accelerator.current_accelerator(check_available=True)": NoAccelerator(
        "returns None", "returns None", "check_available exists from 2.7"
    ),
    "torch.accelerator.is_available()": NoAccelerator("returns False", "returns False"),
    "torch.accelerator.device_count()": NoAccelerator("returns 0", "returns 0"),
    "torch.accelerator.current_device_index()": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.accelerator.set_device_index(0)": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.accelerator.set_device_index(-1)": NoAccelerator("returns None", "", "a negative index is a no-op"),
    "torch.accelerator.synchronize()": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.accelerator.current_stream()": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.accelerator.device_index(None).__enter__()": NoAccelerator("returns None", ""),
    "torch.accelerator.device_index(0).__enter__()": NoAccelerator("raises RuntimeError", ""),
    "torch.accelerator.empty_cache()": NoAccelerator("raises RuntimeError", "returns None"),
    "torch.accelerator.memory_allocated()": NoAccelerator("raises RuntimeError", "returns 0"),
    "torch.accelerator.max_memory_allocated()": NoAccelerator("raises RuntimeError", "returns 0"),
    "torch.accelerator.reset_peak_memory_stats()": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.accelerator.get_memory_info()": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.accelerator.get_device_capability()": NoAccelerator("raises RuntimeError", "raises RuntimeError"),
    "torch.get_device_module()": NoAccelerator(
        "returns module",
        "returns module",
        "torch.cpu in both cases up to 2.13; from 2.14 it follows the compiled-in accelerator (read from the "
        "2.14 sources, not run), so a CUDA build without GPU would get torch.cuda",
    ),
    "torch.get_device_module().manual_seed_all(0)": NoAccelerator("raises AttributeError", "raises AttributeError"),
    "torch.Stream()": NoAccelerator("returns torch.Stream", "raises AcceleratorError"),
    "torch.Event(enable_timing=True).record()": NoAccelerator("raises RuntimeError", "raises AcceleratorError"),
    "torch.device(0)": NoAccelerator("raises RuntimeError", "returns torch.device"),
    "torch.cuda.empty_cache()": NoAccelerator("returns None", "returns None"),
    "torch.cuda.memory_allocated()": NoAccelerator("returns 0", "returns 0"),
    "torch.cuda.manual_seed_all(0)": NoAccelerator("returns None", "returns None"),
    "torch.cuda.synchronize()": NoAccelerator("raises AssertionError", "raises RuntimeError"),
    "torch.cuda.current_device()": NoAccelerator("raises AssertionError", "raises RuntimeError"),
}
