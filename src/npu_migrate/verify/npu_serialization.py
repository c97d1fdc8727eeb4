"""Checkpoints on the simulated NPU: `torch.save` of NPU tensors and `torch.load(map_location="npu")`.

An NPU tensor of the simulated host has no device storage, so torch cannot save or restore one on
its own. Here an NPU tensor is saved as the CPU tensor behind it, its storage tagged with its device
("npu:0", what torch_npu writes for a tensor there), and `torch.load` restores every storage whose location is, or is mapped to, an NPU
as a CPU storage, then moves the tensors built on those storages to the NPU. So `map_location="npu"`,
`{"cuda:0": "npu:0"}` and a checkpoint saved on the NPU load as on an Ascend host, and
`weights_only=True` loads keep working (nothing but plain tensors is pickled).
A callable map_location that returns an NPU storage is not modelled.
"""

from __future__ import annotations

import functools
import threading

import torch

from npu_migrate.verify import npu_device

_state = threading.local()


def _saving() -> dict[int, str]:
    """The NPU tensors being saved: their CPU storage's address -> their device."""
    if not hasattr(_state, "saving"):
        _state.saving = {}
    return _state.saving


def _loading() -> dict[int, str] | None:
    """During a load: the address of each storage bound for an NPU -> that NPU ("npu" = the current one)."""
    return getattr(_state, "loading", None)


def _reduce_ex(self, protocol):
    """An NPU tensor pickles as the CPU tensor behind it; the tagger below names its storage's device."""
    _saving()[self.elem.untyped_storage().data_ptr()] = str(self.device)
    return self.elem.__reduce_ex__(protocol)


def _tag(storage) -> str | None:
    return _saving().get(storage.data_ptr()) if storage.device.type == "cpu" else None


def _restore(storage, location: str):
    """A storage bound for an NPU stays on the CPU for now; `load` moves the tensors built on it."""
    moved = _loading()
    if moved is None or not location.startswith(npu_device.DEVICE_TYPE):
        return None
    moved[storage.data_ptr()] = location
    return storage


def _to_npu(value, moved: dict[int, str], seen: dict[int, object]):
    if id(value) in seen:
        return seen[id(value)]
    result = value
    if isinstance(value, torch.nn.Module):
        value._apply(lambda t: _to_npu(t, moved, seen))
    elif type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        location = moved.get(value.untyped_storage().data_ptr()) if value.device.type == "cpu" else None
        if location is not None:
            result = value.to(location)
            if isinstance(value, torch.nn.Parameter):
                result = torch.nn.Parameter(result, requires_grad=value.requires_grad)
            else:
                result.requires_grad_(value.requires_grad)
    elif isinstance(value, dict):
        for key in list(value):
            value[key] = _to_npu(value[key], moved, seen)
    elif isinstance(value, list):
        value[:] = [_to_npu(item, moved, seen) for item in value]
    elif isinstance(value, tuple):
        items = [_to_npu(item, moved, seen) for item in value]
        result = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    seen[id(value)] = result
    return result


def install() -> None:
    """Register the npu:0 storage tag and wrap `torch.save` / `torch.load` (once per process)."""
    if getattr(torch.load, "_npu_migrate_simulated", False):
        return
    npu_device.NpuTensor.__reduce_ex__ = _reduce_ex
    # Priority 1: before torch's own taggers, which would call the storage "cpu".
    torch.serialization.register_package(1, _tag, _restore)
    save, load = torch.save, torch.load

    @functools.wraps(save)
    def simulated_save(*args, **kwargs):
        try:
            return save(*args, **kwargs)
        finally:
            _saving().clear()

    @functools.wraps(load)
    def simulated_load(*args, **kwargs):
        outer = _loading()
        _state.loading = moved = {}
        try:
            result = load(*args, **kwargs)
        finally:
            _state.loading = outer
        return _to_npu(result, moved, {}) if moved else result

    simulated_save._npu_migrate_simulated = True
    simulated_load._npu_migrate_simulated = True
    torch.save = torch.serialization.save = simulated_save
    torch.load = torch.serialization.load = simulated_load
