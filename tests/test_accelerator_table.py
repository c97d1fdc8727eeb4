"""Checks on transforms/data/torch_accelerator.toml and the script that generates it.

No network and no wheels: the TOML is read as committed.  Its internal
consistency is checked on its own; its names and signatures against the
installed torch (the project pins a CPU build of the table's reference
version); its claims about hosts without accelerator by calling the
originals and counterparts on that torch.  The generator's extraction runs on
a small wheel made here.
"""

import ast
import functools
import importlib.util
import inspect
import sys
import tomllib
import types
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed  # noqa: F401 - binds torch.distributed for the attribute walks below

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

REPO_ROOT = Path(__file__).resolve().parent.parent
TOML_PATH = REPO_ROOT / "transforms" / "data" / "torch_accelerator.toml"
NPU_TOML_PATH = REPO_ROOT / "transforms" / "data" / "torch_npu_api.toml"
SCRIPTS = REPO_ROOT / "scripts"
INSTALLED = torch.__version__.split("+")[0]

KINDS = {"accelerator", "torch", "device_module", "none"}
# Calls need arguments for these; everything else with an all-default signature is called bare.
PROBE_ARGUMENTS = {"manual_seed": (0,), "manual_seed_all": (0,), "set_device": (0,)}

no_accelerator_here = pytest.mark.skipif(
    torch.accelerator.current_accelerator() is not None,
    reason="the behaviour claims are about hosts without accelerator; this torch has one",
)


@pytest.fixture(scope="module")
def table():
    with TOML_PATH.open("rb") as handle:
        return tomllib.load(handle)


@pytest.fixture(scope="module")
def generator():
    # The generator imports its sibling modules (the curated data, the TOML writer) by name.
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(
            "generate_accelerator_tables", SCRIPTS / "generate_accelerator_tables.py"
        )
        module = importlib.util.module_from_spec(spec)
        # dataclasses resolves string annotations through sys.modules.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def dotted_names(version: dict) -> set[str]:
    """Every dotted name a version's tables say exists, rebuilt independently of the generator."""
    names = set(version["related"])
    if version["accelerator"]:
        names |= {"torch.accelerator"} | {f"torch.accelerator.{name}" for name in version["accelerator"]}
    for submodule, members in version["accelerator_submodules"].items():
        names.add(f"torch.accelerator.{submodule}")
        names |= {f"torch.accelerator.{submodule}.{name}" for name in members}
    for module in ("cpu", "amp"):
        if version[module]:
            names |= {f"torch.{module}"} | {f"torch.{module}.{name}" for name in version[module]}
    return names


def resolve(dotted: str) -> object:
    """``torch.a.b`` -> the object, by attribute access from the installed torch (AttributeError if absent)."""
    target = torch
    for part in dotted.split(".")[1:]:
        target = getattr(target, part)
    return target


def outcome(call: Callable[[], object]) -> str:
    """What a call does, in the vocabulary of the table's no_accelerator section."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = call()
    except Exception as error:
        return f"raises {type(error).__name__}"
    if value is None or isinstance(value, (bool, int, str)):
        return f"returns {value!r}"
    if isinstance(value, types.ModuleType):
        return "returns module"
    return f"returns {type(value).__module__}.{type(value).__name__}"


def parameters_of(signature_text: str) -> list[tuple[str, str, bool]]:
    """(name, kind, has default) per parameter of a recorded ``(a, b=1, *, c)`` signature."""
    arguments = ast.parse(f"def f{signature_text}: pass").body[0].args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [False] * (len(positional) - len(arguments.defaults)) + [True] * len(arguments.defaults)
    result = [
        (argument.arg, "POSITIONAL_ONLY" if argument in arguments.posonlyargs else "POSITIONAL_OR_KEYWORD", default)
        for argument, default in zip(positional, defaults)
    ]
    if arguments.vararg:
        result.append((arguments.vararg.arg, "VAR_POSITIONAL", False))
    result += [
        (argument.arg, "KEYWORD_ONLY", default is not None)
        for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults)
    ]
    if arguments.kwarg:
        result.append((arguments.kwarg.arg, "VAR_KEYWORD", False))
    return result


def installed_parameters(target: object) -> list[tuple[str, str, bool]]:
    return [
        (parameter.name, parameter.kind.name, parameter.default is not inspect.Parameter.empty)
        for parameter in inspect.signature(target).parameters.values()
    ]


def recorded_signature(table: dict, generator, name: str, version: str) -> str | None:
    """The signature in force at ``version``: the last change recorded at or before it."""
    changes = table["signatures"].get(name, {})
    in_force = [v for v in changes if generator.version_key(v) <= generator.version_key(version)]
    return changes[in_force[-1]] if in_force else None


# --------------------------------------------------------------------------
# Internal consistency
# --------------------------------------------------------------------------


def test_versions_are_ordered_and_cover_the_installed_torch(table, generator):
    meta = table["meta"]
    assert meta["versions"] == sorted(meta["versions"], key=generator.version_key)
    assert list(table["versions"]) == meta["versions"]
    assert (meta["oldest"], meta["newest"]) == (meta["versions"][0], meta["versions"][-1])
    assert meta["cuda_reference"] in meta["versions"]
    # The name checks below are only as good as the installed torch being one the table read.
    assert INSTALLED in meta["versions"]
    for version, entry in table["versions"].items():
        assert entry["wheel"].startswith(f"torch-{version}-"), version


def test_lists_are_sorted_and_unique(table):
    for version, entry in table["versions"].items():
        for key in ("accelerator", "accelerator_deprecated", "cpu", "amp"):
            assert entry[key] == sorted(set(entry[key])), f"{version}.{key}"
        assert len(entry["related"]) == len(set(entry["related"])), version
        assert set(entry["accelerator_deprecated"]) <= set(entry["accelerator"]), version
        for submodule, members in entry["accelerator_submodules"].items():
            assert members == sorted(set(members)), f"{version}.{submodule}"


def test_introduced_and_removed_agree_with_the_version_lists(table):
    introduced, removed, seen = {}, {}, set()
    for version, entry in table["versions"].items():
        names = dotted_names(entry)
        for name in names:
            introduced.setdefault(name, version)
        for name in seen - names:
            removed.setdefault(name, version)
        seen |= names
    assert table["introduced"] == introduced
    assert table["removed"] == removed


def test_accelerator_arrives_in_2_6_with_its_later_additions(table):
    introduced = table["introduced"]
    assert introduced["torch.accelerator"] == "2.6.0"
    assert introduced["torch.accelerator.device_index"] == "2.8.0"
    assert introduced["torch.accelerator.memory_allocated"] == "2.9.0"
    assert introduced["torch.accelerator.Graph"] == "2.12.0"
    assert introduced["torch.accelerator.random.initial_seed"] == "2.14.0"
    assert list(table["signatures"]["torch.accelerator.current_accelerator"].items()) == [
        ("2.6.0", "()"),
        ("2.7.0", "(check_available=False)"),
    ]


def test_signature_history_records_only_changes_of_present_names(table):
    for name, changes in table["signatures"].items():
        texts = list(changes.values())
        assert all(earlier != later for earlier, later in zip(texts, texts[1:])), name
        for version in changes:
            assert name in dotted_names(table["versions"][version]), (name, version)
        assert changes and list(changes)[0] == table["introduced"][name], name


def test_cuda_entries_are_consistent(table):
    introduced = table["introduced"]
    for name, entry in table["cuda"].items():
        assert entry["kind"] in KINDS, name
        counterpart = entry["counterpart"]
        if entry["kind"] == "none":
            assert (counterpart, entry["since"], entry["fallback"], entry["needs_guard"]) == ("", "", "", False), name
            assert entry["note"], f"torch.cuda.{name} has no counterpart and no note saying what to do"
            continue
        prefix = table["meta"]["device_module_prefix"]
        lookup = "torch.get_device_module" if counterpart.startswith(prefix) else counterpart
        assert entry["since"] == introduced[lookup], name
        assert (entry["kind"] == "device_module") == counterpart.startswith(prefix), name
        assert (entry["kind"] == "accelerator") == counterpart.startswith("torch.accelerator"), name
        if entry["fallback"]:
            assert entry["fallback"].startswith(prefix), name


def test_get_device_capability_is_not_the_same_name_in_accelerator(table):
    # The names match but the meanings do not: a rename would turn (major, minor) into a dict.
    entry = table["cuda"]["get_device_capability"]
    assert entry["kind"] == "none"
    assert "not torch.accelerator.get_device_capability" in entry["note"]
    assert table["introduced"]["torch.accelerator.get_device_capability"] == "2.10.0"


def test_serialiser_round_trips_the_committed_file(table, generator):
    assert generator.dump_toml(table, generator.HEADER) == TOML_PATH.read_text(encoding="utf-8")


# --------------------------------------------------------------------------
# Against the installed torch
# --------------------------------------------------------------------------


def test_cuda_names_are_those_of_the_installed_torch(table):
    if INSTALLED != table["meta"]["cuda_reference"]:
        pytest.fail(f"the table maps torch {table['meta']['cuda_reference']}'s torch.cuda; installed is {INSTALLED}")
    public = {name for name in table["cuda"] if not name.startswith("memory.")}
    assert public == set(torch.cuda.__all__)
    assert set(torch.cuda.memory.__all__) <= public
    for name in set(table["cuda"]) - public:
        assert callable(resolve(f"torch.cuda.{name}")), name


def test_installed_torch_has_exactly_the_names_recorded_for_it(table):
    recorded = dotted_names(table["versions"][INSTALLED])
    assert sorted(torch.accelerator.__all__) == table["versions"][INSTALLED]["accelerator"]
    for name in sorted(recorded):
        resolve(name)
    later = set().union(*(dotted_names(entry) for entry in table["versions"].values())) - recorded
    assert "torch.accelerator.random" in later
    for name in sorted(later):
        with pytest.raises(AttributeError):
            resolve(name)


def test_recorded_signatures_match_the_installed_torch(table, generator):
    compared = 0
    for name in table["signatures"]:
        text = recorded_signature(table, generator, name, INSTALLED)
        if text is None or name not in dotted_names(table["versions"][INSTALLED]):
            continue
        target = resolve(name)
        try:
            parameters = installed_parameters(target)
        except ValueError:
            continue  # a C function without a Python signature (torch.Stream...): only the stub has one
        assert parameters_of(text) == parameters, name
        compared += 1
    assert compared >= 30


def test_counterparts_exist_from_their_first_version(table, generator):
    installed = generator.version_key(INSTALLED)
    for entry in table["cuda"].values():
        if entry["kind"] in ("none", "device_module"):
            continue
        if generator.version_key(entry["since"]) <= installed:
            resolve(entry["counterpart"])
        else:
            with pytest.raises(AttributeError):
                resolve(entry["counterpart"])


def test_device_module_counterparts_exist_on_torch_npu(table):
    # The NPU host is where the portable target must keep working; torch_npu's table says what torch.npu has.
    with NPU_TOML_PATH.open("rb") as handle:
        npu = tomllib.load(handle)
    newest = npu["versions"][npu["meta"]["default"]]
    npu_names = set(newest["npu_all"]) | set(newest["npu_attributes"])
    prefix = table["meta"]["device_module_prefix"]
    for name, entry in table["cuda"].items():
        for target in (entry["counterpart"], entry["fallback"]):
            if target.startswith(prefix):
                assert target.removeprefix(prefix) in npu_names, f"torch.cuda.{name}: {target}"


def _call_target(table: dict, target: str, arguments: tuple) -> Callable[[], object]:
    prefix = table["meta"]["device_module_prefix"]
    if target.startswith(prefix):
        return lambda: getattr(torch.get_device_module(), target.removeprefix(prefix))(*arguments)
    return lambda: resolve(target)(*arguments)


@no_accelerator_here
def test_needs_guard_is_what_a_cpu_only_host_does(table, generator):
    installed = generator.version_key(INSTALLED)
    checked = 0
    for name, entry in table["cuda"].items():
        if entry["kind"] == "none" or generator.version_key(entry["since"]) > installed or name.startswith("memory."):
            continue
        original = resolve(f"torch.cuda.{name}")
        if isinstance(original, types.ModuleType) or not callable(original):
            continue
        if name in PROBE_ARGUMENTS:
            arguments = PROBE_ARGUMENTS[name]
        elif all(default for _, kind, default in parameters_of(entry["cuda_signature"]) if not kind.startswith("VAR")):
            arguments = ()
        else:
            continue
        before = outcome(functools.partial(original, *arguments))
        after = outcome(_call_target(table, entry["counterpart"], arguments))
        crashes_only_after = before.startswith("returns") and after.startswith("raises")
        assert entry["needs_guard"] == crashes_only_after, f"torch.cuda.{name}: original {before}, counterpart {after}"
        checked += 1
    assert checked >= 40


@no_accelerator_here
def test_no_accelerator_claims_hold_for_this_cpu_build(table):
    for call, facts in table["no_accelerator"].items():
        assert outcome(functools.partial(eval, call, {"torch": torch})) == facts["cpu_build"], call


# --------------------------------------------------------------------------
# The generator's extraction and checks, on a wheel made here
# --------------------------------------------------------------------------

_FAKE_ACCELERATOR = """
from typing_extensions import deprecated
from ._utils import _device_t
from .memory import empty_cache, memory_allocated
from . import random

__all__ = ["current_device_index", "current_device_idx", "synchronize", "empty_cache", "memory_allocated"]

def current_device_index() -> int: ...
current_device_idx = deprecated("Use `current_device_index` instead.")(current_device_index)
def synchronize(device: _device_t = None, /) -> None: ...
class device_index:
    def __init__(self, device: int | None, /) -> None: ...
"""

_FAKE_MEMORY = """
__all__ = ["empty_cache", "memory_allocated"]
def empty_cache() -> None: ...
def memory_allocated(device_index: "_device_t" = None, /) -> int: ...
def _snapshot(): ...
"""


def test_extraction_reads_names_submodules_and_signatures(generator, tmp_path):
    wheel = tmp_path / "torch-9.9.0-cp311-none-macosx_11_0_arm64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torch/accelerator/__init__.py", _FAKE_ACCELERATOR)
        archive.writestr("torch/accelerator/_utils.py", "_device_t = object\n")
        archive.writestr("torch/accelerator/memory.py", _FAKE_MEMORY)
        archive.writestr("torch/accelerator/random.py", "def initial_seed(device=None, /): ...\n")
        archive.writestr("torch/cpu/__init__.py", "__all__ = ['synchronize']\nfrom . import amp\n")
        archive.writestr("torch/cpu/amp/__init__.py", "")
        archive.writestr(
            "torch/_C/__init__.pyi", "class Stream:\n    def __new__(cls, device=None, *, priority=0): ...\n"
        )
    extracted = generator.extract_wheel(wheel)
    assert extracted.table["accelerator"] == sorted(
        ["current_device_index", "current_device_idx", "synchronize", "empty_cache", "memory_allocated"]
    )
    assert extracted.table["accelerator_deprecated"] == ["current_device_idx"]
    assert extracted.table["accelerator_submodules"] == {
        "memory": ["empty_cache", "memory_allocated"],
        "random": ["initial_seed"],
    }
    assert extracted.table["cpu"] == ["amp", "synchronize"]
    assert extracted.table["related"] == ["torch.Stream"]
    assert "torch.accelerator.device_index" not in extracted.names  # defined, but not in __all__
    signatures = extracted.signatures
    assert signatures["torch.accelerator.synchronize"] == "(device=None, /)"
    assert signatures["torch.accelerator.current_device_idx"] == "()"
    assert signatures["torch.accelerator.device_index"] == "(device, /)"
    # Re-exported from the submodule, so the top-level name carries the submodule's signature.
    assert signatures["torch.accelerator.memory_allocated"] == "(device_index=None, /)"
    assert signatures["torch.accelerator.memory.memory_allocated"] == "(device_index=None, /)"
    assert signatures["torch.Stream"] == "(device=None, *, priority=0)"


def test_generator_refuses_torch_cuda_names_it_has_no_entry_for(generator):
    surfaces = {"2.6.0": {"torch.accelerator.synchronize", "torch.get_device_module", "torch.Stream"}}
    names = sorted(generator.CUDA_COUNTERPARTS)
    with pytest.raises(generator.GenerationError, match="no entry for"):
        generator.cuda_table([*names, "brand_new_cuda_api"], {}, surfaces)
    with pytest.raises(generator.GenerationError, match="lacks"):
        generator.cuda_table(names[1:], {}, surfaces)


def test_a_counterpart_that_disappears_is_an_error(generator):
    surfaces = {"2.6.0": {"torch.accelerator.x"}, "2.7.0": set(), "2.8.0": {"torch.accelerator.x"}}
    with pytest.raises(generator.GenerationError, match="missing from 2.7.0"):
        generator.first_version("torch.accelerator.x", surfaces, "test")
    with pytest.raises(generator.GenerationError, match="none of the releases"):
        generator.first_version("torch.accelerator.y", surfaces, "test")
    assert (
        generator.first_version("torch.get_device_module().f", {"2.4.0": {"torch.get_device_module"}}, "t") == "2.4.0"
    )
