"""What torch_npu offers, per version: the data tables the rules consult.

`transforms/data/torch_npu_api.toml` is generated from the torch_npu wheels on PyPI
(`scripts/generate_api_tables.py`); `transforms/data/cuda_api.toml` holds the hand-kept renames,
behaviour differences and advice. Both are read once per process.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path


class UnknownVersionError(ValueError):
    pass


class Kind(enum.Enum):
    SAME = "same"  # torch.npu.<same name>
    RENAMED = "renamed"
    CAVEAT = "caveat"  # exists, behaves differently: report, never rewrite
    MISSING = "missing"  # no counterpart in the chosen torch_npu version
    UNKNOWN = "unknown"  # not a name we know from torch.cuda either
    OWNED = "owned"  # another rule family handles it
    DEVICE_MODULE = "device_module"  # the portable target: the same name on the accelerator's torch module


@dataclass(frozen=True)
class Mapping:
    kind: Kind
    target: str | None = None
    advice: str = ""


@functools.cache
def load_table(name: str) -> dict:
    """A TOML table from `transforms/data/`, read once per process (found without importing the rules)."""
    spec = importlib.util.find_spec("npu_migrate.transforms")
    assert spec is not None and spec.submodule_search_locations, "npu_migrate.transforms is installed with npu_migrate"
    data = Path(next(iter(spec.submodule_search_locations)), "data", name).read_bytes()
    return tomllib.loads(data.decode("utf-8"))


def package_table() -> dict[str, dict]:
    """Third-party packages that only run on NVIDIA GPUs (`third_party.toml`), by module prefix."""
    return load_table("third_party.toml")["packages"]


def cuda_package(qualname: str, table: dict[str, dict]) -> tuple[str, dict] | None:
    """The longest listed prefix of `qualname` (`apex.optimizers.FusedAdam` -> `apex.optimizers`)."""
    parts = qualname.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        if prefix in table:
            return prefix, table[prefix]
    return None


def _version_key(version: str) -> tuple:
    main, _, post = version.partition(".post")
    return (*(int(p) for p in main.split(".")), int(post or 0))


def available_versions() -> list[str]:
    return sorted(load_table("torch_npu_api.toml")["versions"], key=_version_key)


def default_version() -> str:
    return load_table("torch_npu_api.toml")["meta"]["default"]


class NpuApi:
    """The torch_npu API surface of one version, and how torch.cuda names map onto it.

    A version asked for by name is checked at once (UnknownVersionError); the default one is read when
    first used, so a run whose files need no rule never parses the 250 kB table (start-up, #16)."""

    #: What `_load` sets; reading any of them loads the tables.
    _LOADED = frozenset(
        {"version", "npu_names", "npu_amp", "distributed", "fused_ops", "cuda_names"}
        | {"_owned", "_renamed", "_caveats", "_no_equivalent"}
    )

    target = "npu"

    def __init__(self, version: str | None = None) -> None:
        self._requested = version
        if version is not None:
            self._load()

    def __getattr__(self, name: str):  # only called for attributes not set yet
        if name in NpuApi._LOADED and "_requested" in self.__dict__:
            self._load()
            return self.__dict__[name]
        raise AttributeError(name)

    def _load(self) -> None:
        version = self._requested
        tables = load_table("torch_npu_api.toml")
        self.version = version or tables["meta"]["default"]
        if self.version not in tables["versions"]:
            known = ", ".join(available_versions())
            raise UnknownVersionError(f"unknown torch_npu version {self.version!r}; known versions: {known}")
        entry = tables["versions"][self.version]
        self.npu_names = frozenset(entry["npu_all"]) | frozenset(entry.get("npu_attributes", ()))
        self.npu_amp = frozenset(entry.get("npu_amp", ()))
        self.distributed = frozenset(entry.get("distributed", ()))
        self.fused_ops = frozenset(entry.get("fused_ops", ()))
        self.cuda_names = frozenset(tables["torch_cuda"]["all"])
        curated = load_table("cuda_api.toml")
        self._owned = tuple(curated["owned"]["prefixes"])
        self._renamed: dict[str, str] = curated["renamed"]
        self._caveats: dict[str, str] = curated["caveats"]
        self._no_equivalent: dict[str, str] = curated["no_equivalent"]

    def has_npu(self, name: str) -> bool:
        return name in self.npu_names

    def map_cuda(self, qualname: str) -> Mapping:
        """How `torch.cuda.<...>` maps for this torch_npu version."""
        assert qualname == "torch.cuda" or qualname.startswith("torch.cuda.")
        if qualname == "torch.cuda":
            return Mapping(Kind.SAME, "torch.npu")
        if any(qualname == p or qualname.startswith(p + ".") for p in self._owned):
            return Mapping(Kind.OWNED)
        parts = qualname.split(".")
        # Longest curated prefix wins: torch.cuda.nvtx.range_push before torch.cuda.nvtx.
        for depth in range(len(parts), 2, -1):
            prefix = ".".join(parts[:depth])
            suffix = parts[depth:]
            if prefix in self._renamed:
                target = ".".join([self._renamed[prefix], *suffix])
                return self._check_target(qualname, target, Kind.RENAMED)
            if prefix in self._caveats:
                return Mapping(Kind.CAVEAT, advice=self._caveats[prefix])
            if prefix in self._no_equivalent:
                return Mapping(Kind.MISSING, advice=self._no_equivalent[prefix])
        name = parts[2]
        if name in self.npu_names:
            return Mapping(Kind.SAME, ".".join(["torch", "npu", *parts[2:]]))
        if name in self.cuda_names:
            return Mapping(
                Kind.MISSING,
                advice=f"torch.cuda.{name} has no counterpart in torch_npu {self.version}.",
            )
        return Mapping(
            Kind.UNKNOWN,
            advice=f"torch.cuda.{name} is not a public torch.cuda API known to npu-migrate; check it by hand.",
        )

    def _check_target(self, qualname: str, target: str, kind: Kind) -> Mapping:
        parts = target.split(".")
        if parts[:2] == ["torch", "npu"] and parts[2] not in self.npu_names:
            return Mapping(
                Kind.MISSING,
                advice=f"{qualname} maps to {'.'.join(parts[:3])}, which torch_npu {self.version} does not have; "
                "choose a newer --torch-npu-version if your cluster has one.",
            )
        return Mapping(kind, target)


#: What `apply --target` migrates to: "npu" rewrites CUDA code for Ascend NPUs; "portable" rewrites it to
#: device-generic code (`torch.accelerator`) that picks CUDA, the NPU or the CPU at run time.
TARGETS = ("npu", "portable")
DEFAULT_TARGET = "npu"

#: How the portable target spells "the accelerator's device type" where the original said "cuda": "npu" on
#: an Ascend host, and "cuda" on every other one: a CUDA host, a host without accelerator, and one whose
#: accelerator is another (Apple MPS, Intel XPU), where the original's torch.cuda calls found no GPU and its
#: CPU fallback ran: the migrated code gets the original's value there (never a flipped default, never another
#: device). `current_accelerator()` returns None without an accelerator from torch 2.7; 2.6 raises instead, so
#: the spelling needs 2.7.
ACCELERATOR_TYPE = '"npu" if getattr(torch.accelerator.current_accelerator(), "type", None) == "npu" else "cuda"'
ACCELERATOR_TYPE_SINCE = "2.7.0"
#: The spelling npu-migrate 0.x wrote before (the accelerator's own type: "mps" on an Apple host): a file that
#: defines `ACCELERATOR` so is given the current spelling.
LEGACY_ACCELERATOR_TYPES = ('getattr(torch.accelerator.current_accelerator(), "type", "cuda")',)
#: What the portable target calls where torch.accelerator has no equivalent: `torch.get_device_module(<the
#: accelerator's type>)` is torch.cuda where that type is "cuda" (every host but an Ascend one) and torch.npu
#: on an Ascend host, so `<it>.X` is the original there and the npu target's `torch.npu.X` here.
DEVICE_MODULE = "torch.get_device_module"
#: Tests that decide the device: torch.accelerator's answer for any accelerator (True on an MPS host), the
#: accelerator's module's for CUDA or the NPU only, as the original's for CUDA.
ON_THE_ACCELERATORS_MODULE = frozenset({"torch.cuda.is_available", "torch.cuda.device_count"})


def torch_versions() -> list[str]:
    """The torch versions `torch_accelerator.toml` knows, oldest first."""
    return sorted(load_table("torch_accelerator.toml")["meta"]["versions"], key=_version_key)


class PortableApi(NpuApi):
    """The portable target: how `torch.cuda` names map onto `torch.accelerator` for one torch version
    (`transforms/data/torch_accelerator.toml`), on top of what the npu target knows (the fused branches
    are the same in both targets)."""

    target = "portable"

    def __init__(self, version: str | None = None, torch_version: str | None = None) -> None:
        super().__init__(version)
        table = load_table("torch_accelerator.toml")
        self.torch_version = torch_version or table["meta"]["newest"]
        if self.torch_version not in table["meta"]["versions"]:
            known = ", ".join(torch_versions())
            raise UnknownVersionError(f"unknown torch version {self.torch_version!r}; known versions: {known}")
        self._introduced: dict[str, str] = table["introduced"]
        self._counterparts: dict[str, dict] = table["cuda"]

    def has(self, qualname: str) -> bool:
        """Whether the chosen torch version has `qualname` (`torch.accelerator.synchronize`)."""
        since = self._introduced.get(qualname)
        return since is not None and _version_key(since) <= _version_key(self.torch_version)

    def at_least(self, version: str) -> bool:
        return _version_key(self.torch_version) >= _version_key(version)

    @property
    def accelerator_type(self) -> str | None:
        """The code for "the accelerator's device type" (None where this torch version cannot say it safely)."""
        return ACCELERATOR_TYPE if self.at_least(ACCELERATOR_TYPE_SINCE) else None

    def map_cuda(self, qualname: str) -> Mapping:
        """How `torch.cuda.<...>` maps onto the device-generic API of this torch version: `torch.accelerator`
        where it has the name and behaves the same, else the accelerator's torch module where that is
        provably the original on CUDA and the npu target's rewrite on the NPU (`Kind.DEVICE_MODULE`, the
        target being the names below `torch.cuda`), else a finding."""
        mapping = self._map_generic(qualname)
        if qualname in ON_THE_ACCELERATORS_MODULE:
            tail = self.device_module_tail(qualname)
            if tail is None:
                return Mapping(
                    Kind.MISSING,
                    advice=f"it decides the device, and torch {self.torch_version} cannot name the accelerator "
                    "without one (2.7+): choose a newer --torch-version if your installations have it",
                )
            return self._on_the_module(qualname, tail)
        if mapping.kind in (Kind.MISSING, Kind.CAVEAT):
            tail = self.device_module_tail(qualname)
            if tail is not None:
                return self._on_the_module(qualname, tail)
        return mapping

    @staticmethod
    def _on_the_module(qualname: str, tail: str) -> Mapping:
        return Mapping(
            Kind.DEVICE_MODULE,
            tail,
            advice=f"use `{DEVICE_MODULE}(ACCELERATOR).{tail}`: `{qualname}` on every host but an Ascend one, "
            f"`torch.npu.{tail}` there",
        )

    def device_module_tail(self, qualname: str) -> str | None:
        """The names below `torch.cuda` (`manual_seed_all`) where `torch.get_device_module(ACCELERATOR).<them>`
        may replace `qualname`: this torch version has `get_device_module`, and the npu target rewrites
        `qualname` to `torch.npu.<the same names>` (which its torch_npu version has, no behaviour caveat)."""
        if not (self.has(DEVICE_MODULE) and self.at_least(ACCELERATOR_TYPE_SINCE)):
            return None
        if qualname == "torch.cuda" or any(qualname == p or qualname.startswith(p + ".") for p in self._owned):
            return None
        npu = NpuApi.map_cuda(self, qualname)
        if npu.kind is not Kind.SAME or npu.target != "torch.npu" + qualname[len("torch.cuda") :]:
            return None
        return qualname[len("torch.cuda.") :]

    def _map_generic(self, qualname: str) -> Mapping:
        assert qualname == "torch.cuda" or qualname.startswith("torch.cuda.")
        if qualname == "torch.cuda":
            return Mapping(Kind.MISSING, advice="the module torch.cuda has no device-generic counterpart as a whole")
        if any(qualname == p or qualname.startswith(p + ".") for p in self._owned):
            return Mapping(Kind.OWNED)
        parts = qualname.split(".")
        name = parts[2]
        entry = self._counterparts.get(".".join(parts[2:4])) or self._counterparts.get(name)
        if entry is None:
            return Mapping(
                Kind.UNKNOWN,
                advice=f"torch.cuda.{name} is not a public torch.cuda API known to npu-migrate; check it by hand.",
            )
        note = f" ({entry['note']})" if entry["note"] else ""
        kind, counterpart = entry["kind"], entry["counterpart"]
        leaf = self._counterparts.get(parts[3]) if len(parts) > 3 else None
        if kind == "accelerator" and leaf is not None and leaf["needs_guard"]:
            entry, note = leaf, f" ({leaf['note']})" if leaf["note"] else ""
        if kind == "accelerator":
            target = ".".join([counterpart, *parts[3:]]) if len(parts) > 3 and "." not in name else counterpart
            if entry["needs_guard"]:
                return Mapping(
                    Kind.MISSING,
                    advice=f"`{target}` raises on a host without accelerator, where torch.cuda.{name} does not: "
                    f"call it under `if torch.accelerator.is_available():`{note}.",
                )
            if not self.has(target):
                return Mapping(
                    Kind.MISSING,
                    advice=f"torch {self.torch_version} has no `{target}` (from {self._introduced.get(target, '?')}); "
                    "choose a newer --torch-version if your installations have it"
                    + (f", or use `{entry['fallback']}`" if entry["fallback"] else ""),
                )
            # A class (Graph), whose methods take other arguments, or `device`, which takes an index only where
            # torch.cuda.device also takes a torch.device or "cuda:1": the call sites need a human.
            if target.rsplit(".", 1)[-1][:1].isupper() or name == "device":
                return Mapping(Kind.CAVEAT, advice=f"the device-generic `{target}` differs{note}; port it by hand.")
            return Mapping(Kind.SAME if target.rsplit(".", 1)[-1] == parts[-1] else Kind.RENAMED, target)
        if kind == "torch":
            return Mapping(Kind.CAVEAT, advice=f"the device-generic `{counterpart}` differs{note}; port it by hand.")
        if kind == "device_module":
            return Mapping(
                Kind.MISSING,
                advice=f"no torch.accelerator counterpart; `{counterpart}` reaches the current accelerator's "
                f"module{note}.",
            )
        return Mapping(Kind.MISSING, advice=f"torch.cuda.{name} has no device-generic counterpart{note}.")
