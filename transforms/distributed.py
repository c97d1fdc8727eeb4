"""torch.distributed: the NCCL backend becomes HCCL, CUDA device meshes NPU ones, DataParallel is reported.

Backend names are rewritten where they reach torch: the backend argument of `init_process_group` and its
relatives, and the simple ways a program carries that value from elsewhere in the same file (a variable,
an argparse option, a dataclass field, an attribute or a dict entry named "...backend"). A backend whose
value cannot be followed (a config object, a function result) is left alone and reported. Strings that
merely mention NCCL (log messages, docstrings, a variable called `nccl`) are never touched.

Driven by `data/distributed.toml`.
"""

from __future__ import annotations

import re

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.api import ACCELERATOR_TYPE, load_table
from npu_migrate.program.imports import dotted_node
from npu_migrate.transforms.common.accelerator import accelerator_backend, accelerator_type, portable
from npu_migrate.transforms.common.arguments import argument, keyword
from npu_migrate.transforms.common.comparisons import LiteralComparisons
from npu_migrate.transforms.common.devices import device_literal, has_device_literal, rewrite_device_literal
from npu_migrate.transforms.common.qualnames import torch_npu_root
from npu_migrate.transforms.common.strings import replaceable, string_value, with_value

BACKEND = Rule(
    id="NPU301",
    name="nccl-backend",
    family="distributed",
    summary='The `"nccl"` process-group backend becomes `"hccl"` (`"cuda:nccl"` becomes `"npu:hccl"`)',
    what="""
    Rewrites the backend of `init_process_group`, `new_group`, `new_subgroups(_by_enumeration)`,
    `Backend(...)` and `is_backend_available`, whether written at the call or carried there within the
    file: a variable assigned a literal, a parameter default, an argparse `--backend` / `--dist-backend`
    option (default and choices), a dataclass field, an attribute, a dict entry or keyword argument whose
    name contains "backend". `"cpu:gloo,cuda:nccl"` becomes `"cpu:gloo,npu:hccl"`. In launch scripts,
    `--backend nccl` options become `--backend hccl`.
    """,
    why="""
    NCCL is NVIDIA's collective library; an explicit "nccl" backend fails on NPU, where torch_npu
    registers HCCL. (torch 2.13 picks hccl on its own when no backend is given.)
    """,
    example=Example(
        before="""
            import argparse

            import torch.distributed as dist

            parser = argparse.ArgumentParser()
            parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
            args = parser.parse_args()
            dist.init_process_group(backend=args.backend)
        """,
        after="""
            import argparse

            import torch.distributed as dist
            import torch_npu

            parser = argparse.ArgumentParser()
            parser.add_argument("--backend", default="hccl", choices=["hccl", "gloo"])
            args = parser.parse_args()
            dist.init_process_group(backend=args.backend)
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    Besides the backend argument, the rule rewrites values your program exposes: the default and
    choices of its own `--backend` option, dataclass fields and config entries. Launch commands and
    configuration files outside the migrated tree that pass "nccl" must say "hccl" too.
    """,
    targets=EVERY_TARGET,
)

NCCL_API = Rule(
    id="NPU302",
    name="nccl-api",
    family="distributed",
    summary="`Backend.NCCL`, `is_nccl_available()` and `ProcessGroupNCCL` become their HCCL counterparts",
    what="""
    Rewrites `dist.Backend.NCCL` -> `dist.Backend.HCCL`, `dist.is_nccl_available()` ->
    `dist.is_hccl_available()` (both exist once torch_npu is imported), and
    `torch.distributed.ProcessGroupNCCL` (with its `Options`) ->
    `torch_npu._C._distributed_c10d.ProcessGroupHCCL`. Imports of these names are rebound to torch_npu
    and keep their local names. `ProcessGroupNCCL` reached through torch is only rewritten when the file
    can name `torch_npu` (it imports it, or rule NPU001 adds the import).
    """,
    why="""
    On NPU, NCCL is never available: `is_nccl_available()` is False and `ProcessGroupNCCL` cannot be
    built, so code that checks for or configures NCCL takes the wrong path or fails.
    """,
    example=Example(
        before="""
            import torch.distributed as dist

            if dist.is_nccl_available():
                opts = dist.ProcessGroupNCCL.Options()
        """,
        after="""
            import torch.distributed as dist
            import torch_npu

            if dist.is_hccl_available():
                opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
        """,
    ),
    fix_safety=FixSafety.SAFE,
)

DEVICE_MESH = Rule(
    id="NPU303",
    name="device-mesh-type",
    family="distributed",
    summary='`init_device_mesh("cuda", ...)` and `DeviceMesh("cuda", ...)` build NPU meshes',
    what="""
    Rewrites the device type "cuda" of `init_device_mesh` and `DeviceMesh` to "npu".
    """,
    why="""
    The device type of a device mesh selects the process-group backend of its dimensions; a "cuda" mesh
    cannot be built on an NPU host, and torch_npu registers hccl for "npu".
    """,
    example=Example(
        before="""
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
        """,
        after="""
            from torch.distributed.device_mesh import init_device_mesh
            import torch_npu

            mesh = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)

BACKEND_COMPARISON = Rule(
    id="NPU304",
    name="backend-comparison",
    family="distributed",
    summary='Comparisons of a backend with `"nccl"` compare with `"hccl"`',
    what="""
    Comparisons with "nccl" whose other side visibly is a backend (its code mentions "backend") are
    rewritten to compare with "hccl", membership tests like `backend in ("gloo", "nccl")` included;
    other comparisons with "nccl" are reported for review.
    """,
    why="""
    After migration the backend is "hccl", so `dist.get_backend() == "nccl"` silently becomes False.
    """,
    example=Example(
        before="""
            import torch.distributed as dist


            def uses_nccl():
                return dist.get_backend() == "nccl"
        """,
        after="""
            import torch.distributed as dist
            import torch_npu


            def uses_nccl():
                return dist.get_backend() == "hccl"
        """,
    ),
    fix_safety=FixSafety.SAFE,
)

DATA_PARALLEL = Rule(
    id="NPU305",
    name="data-parallel",
    family="distributed",
    summary="`nn.DataParallel` is not supported on NPU: reported, use DistributedDataParallel",
    what="""
    Reports `nn.DataParallel` and `nn.parallel.data_parallel`, and leaves them as they are.
    """,
    why="""
    Single-process multi-device data parallelism has no NPU implementation. Switch to
    `DistributedDataParallel` with one process per device (`torchrun --nproc_per_node N`) and the hccl
    backend.
    """,
    example=Example(
        before="""
            from torch import nn

            model = nn.DataParallel(nn.Linear(4, 2))
        """,
        reports="use DistributedDataParallel",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    tags=frozenset({"performance"}),
    targets=EVERY_TARGET,
)

DDP_DEVICES = Rule(
    id="NPU306",
    name="ddp-device-ids",
    family="distributed",
    summary='DDP `device_ids=["cuda:0"]` (and positional device arguments) name the NPU',
    what="""
    Device strings in `DistributedDataParallel`'s `device_ids` list and in its positional `device_ids` /
    `output_device` arguments become NPU devices (the `output_device=` keyword and `torch.device(...)`
    are NPU102's). Integer device ids stay as they are.
    """,
    why="""
    DDP places its replica on the devices it is given: "cuda:N" does not exist on an NPU host.
    """,
    example=Example(
        before="""
            from torch.nn.parallel import DistributedDataParallel as DDP


            def wrap(model, local_rank):
                return DDP(model, device_ids=[f"cuda:{local_rank}"])
        """,
        after="""
            from torch.nn.parallel import DistributedDataParallel as DDP
            import torch_npu


            def wrap(model, local_rank):
                return DDP(model, device_ids=[f"npu:{local_rank}"])
        """,
    ),
    valid=(
        """
        from torch.nn.parallel import DistributedDataParallel as DDP


        def wrap(model, local_rank):
            return DDP(model, device_ids=[local_rank])
        """,
    ),
    fix_safety=FixSafety.SAFE,
)

BACKEND_NOT_FOLLOWED = Rule(
    id="NPU307",
    name="backend-not-followed",
    family="distributed",
    summary="A process-group backend whose value cannot be followed within the file is reported",
    what="""
    Reports a process-group backend that comes from a config object, a function result or a parameter,
    and leaves the call alone.
    """,
    why="""
    npu-migrate cannot prove what the value is; if it is "nccl" at run time the process group fails on
    NPU. Make sure it is "hccl" (or "cpu:gloo,npu:hccl"), for example in your config files or launch
    scripts.
    """,
    example=Example(
        before="""
            import torch.distributed as dist


            def setup(cfg):
                dist.init_process_group(backend=cfg.dist.backend)
        """,
        reports='make sure it is "hccl"',
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    targets=EVERY_TARGET,
)

_TABLE = load_table("distributed.toml")
_BACKEND_ARGS: dict[str, int] = _TABLE["backend_arguments"]
_DEVICE_TYPE_ARGS: dict[str, int] = _TABLE["device_type_arguments"]
_RENAMED: dict[str, dict[str, str]] = _TABLE["renamed"]
_DDP: dict[str, list[int]] = _TABLE["ddp"]
_DATA_PARALLEL = frozenset(_TABLE["data_parallel"]["names"])
#: A file that puts tensors on the device: `.cuda()`, a "cuda" / "cuda:N" string, `torch.cuda.set_device`.
_DEVICE_TENSORS = re.compile(r"""\.cuda\(|["']cuda(:\d+)?["']|\bcuda\.set_device\b""")
# `distributed_c10d.` is stripped from a name before the tables are asked, which keeps every part of a key.
_NAMES = name_sets([*_BACKEND_ARGS, *_RENAMED, *_DATA_PARALLEL])
_DEVICE_CALLS = name_sets([*_DEVICE_TYPE_ARGS, *_DDP])


def _normalized(qualname: str | None) -> str | None:
    """`torch.distributed.distributed_c10d.X` is `torch.distributed.X`."""
    if qualname is not None and qualname.startswith("torch.distributed.distributed_c10d."):
        return "torch.distributed." + qualname[len("torch.distributed.distributed_c10d.") :]
    return qualname


def hccl_value(value: str) -> str | None:
    """The HCCL spelling of a backend string that names NCCL, else None."""
    if value == "nccl":
        return "hccl"
    pairs = [part.split(":") for part in value.split(",")]
    if ["cuda", "nccl"] in pairs and all(len(p) == 2 and all(p) for p in pairs):
        return ",".join("npu:hccl" if p == ["cuda", "nccl"] else ":".join(p) for p in pairs)
    return None


def _to_hccl(node: cst.SimpleString) -> cst.SimpleString:
    return with_value(node, hccl_value(node.evaluated_value))


def _mentions_backend(name: str) -> bool:
    return "backend" in name.lower()


def _option_dest(call: cst.Call) -> str | None:
    """The attribute an argparse option stores into, if the call is `add_argument` of a "--..." flag."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dest":
            return string_value(arg.value)
    flags = [string_value(a.value) or "" for a in call.args if a.keyword is None]
    long = [f for f in flags if f.startswith("--")]
    return long[0][2:].replace("-", "_") if long else None


#: A value npu-migrate cannot see (a parameter without default, a call result).
UNKNOWN = None


_PORTABLE_BACKEND_ADVICE = (
    "pass `torch.distributed.get_default_backend_for_device(torch.accelerator.current_accelerator())` where the "
    "process group is made (nccl on CUDA, hccl on the NPU), or leave the backend out (torch 2.6+ picks it); only "
    'a plain "nccl" given to the call itself, or chosen under an is_available() test, is rewritten'
)


class DistributedChecker(Checker):
    rules = (BACKEND, NCCL_API, DEVICE_MESH, BACKEND_COMPARISON, DATA_PARALLEL, DDP_DEVICES, BACKEND_NOT_FOLLOWED)
    # "nccl" for the backend strings; each table key has one of the others in a part.
    markers = (
        "nccl",
        "NCCL",
        "Backend",
        "is_backend_available",
        "init_process_group",
        "new_group",
        "new_subgroups",
        "DeviceMesh",
        "init_device_mesh",
        "DataParallel",
        "data_parallel",
    )

    @classmethod
    def wants(cls, index) -> bool:
        # Backend strings are rewritten wherever a backend is set or compared; a call that takes a backend
        # is reported even without one (NPU307), and so is every NCCL or DataParallel name. The device
        # mesh and DDP calls only matter with a "cuda" literal to rewrite.
        return (
            any("nccl" in value and hccl_value(value) is not None for value in index.strings)
            or index.may_name(_NAMES)
            or (index.may_name(_DEVICE_CALLS) and has_device_literal(index))
        )

    @classmethod
    def wants_words(cls, words) -> bool:
        # Without the word "nccl" no backend string names NCCL, unless spelled with escapes, which the
        # "nccl" marker already does not allow for. The rest are identifiers.
        return "nccl" in words or words_may_name(words, _NAMES) or words_may_name(words, _DEVICE_CALLS)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        # What the file assigns, by the name it assigns to: values a backend argument may be traced to.
        self._names: dict[str, list[cst.BaseExpression | None]] = {}
        self._attributes: dict[str, list[cst.BaseExpression | None]] = {}
        self._entries: dict[str, list[cst.BaseExpression | None]] = {}
        self._backend_uses: list[cst.BaseExpression] = []

    # -- where values come from ---------------------------------------------------------------------

    def _record(self, table: dict, name: str, value: cst.BaseExpression | None) -> None:
        table.setdefault(name, []).append(value)
        if _mentions_backend(name):
            self._rewrite(value, f"`{name}`")

    def _rewrite(
        self, node: cst.BaseExpression | None, where: str, *, at_call: bool = False, guarded: bool = False
    ) -> None:
        """Rewrite the NCCL literals a backend value is made of (a literal, a conditional, a container).
        `at_call`: the value is the process-group call's own argument; `guarded`: it is chosen only where an
        accelerator is available (the portable target rewrites only those two: elsewhere, an argparse
        default for one, its value is read on hosts without accelerator too)."""
        if isinstance(node, cst.IfExp):
            available = "is_available()" in self.ctx.code(node.test)
            self._rewrite(node.body, where, at_call=at_call, guarded=available)
            self._rewrite(node.orelse, where, at_call=at_call)
        elif isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            values = [string_value(e.value) for e in node.elements]
            if "hccl" not in values:  # `choices=["nccl", "hccl"]` must not end up with "hccl" twice
                for element in node.elements:
                    self._rewrite(element.value, where)
        elif isinstance(node, cst.Call) and isinstance(node.func, (cst.Name, cst.Attribute)):
            name = node.func.value if isinstance(node.func, cst.Name) else node.func.attr.value
            if name == "field":  # dataclass field(default="nccl")
                default = keyword(node, "default")
                self._rewrite(default.value if default else None, where)
        else:
            value = replaceable(node)
            if value is None or hccl_value(value) is None:
                return
            if portable(self.ctx) is None:
                self.report(BACKEND, node, f'backend in {where} is now "{hccl_value(value)}"', fix=_to_hccl)
                return
            backend = accelerator_backend(self.ctx, self.enabled) if value == "nccl" and (at_call or guarded) else None
            if backend is None:
                self.report(
                    BACKEND,
                    node,
                    f"backend in {where} left as is: {_PORTABLE_BACKEND_ADVICE}",
                    severity=Severity.WARNING,
                )
            else:
                self.report(
                    BACKEND, node, f"backend in {where} is now the current accelerator's", fix=lambda updated: backend
                )

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assigned(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assigned(node.target, node.value)

    def _assigned(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self._record(self._names, target.value, value)
        elif isinstance(target, cst.Attribute):
            self._record(self._attributes, target.attr.value, value)
        elif (
            isinstance(target, cst.Subscript)
            and len(target.slice) == 1
            and isinstance(target.slice[0].slice, cst.Index)
        ):
            key = string_value(target.slice[0].slice.value)
            if key is not None:
                self._record(self._entries, key, value)
        elif isinstance(target, (cst.Tuple, cst.List)):  # unpacking: the values are not visible one by one
            for element in target.elements:
                if isinstance(element.value, cst.Name):
                    self._names.setdefault(element.value.value, []).append(UNKNOWN)

    def visit_Param(self, node: cst.Param) -> None:
        self._record(self._names, node.name.value, node.default)

    def visit_For(self, node: cst.For) -> None:
        if isinstance(node.target, cst.Name):
            self._names.setdefault(node.target.value, []).append(UNKNOWN)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        key = string_value(node.key)
        if key is not None:
            self._record(self._entries, key, node.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and _mentions_backend(node.keyword.value):
            self._rewrite(node.value, f"`{node.keyword.value}=`")

    def _argparse(self, node: cst.Call) -> None:
        dest = _option_dest(node)
        if dest is None or not _mentions_backend(dest):
            return
        default = keyword(node, "default")
        choices = keyword(node, "choices")
        # Without a default or choices the value comes from the command line, which this file does not show.
        if default is not None:
            value = default.value
        else:
            value = cst.Name("None") if choices is not None else UNKNOWN
        self._attributes.setdefault(dest, []).append(value)
        if default is not None:
            self._rewrite(default.value, f"the `--{dest}` option's default")
        if choices is not None:
            self._rewrite(choices.value, f"the `--{dest}` option's choices")

    # -- calls ----------------------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        qualname = _normalized(self.ctx.qualname(node.func))
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            self._argparse(node)
        if qualname in _BACKEND_ARGS:
            arg = argument(node, _BACKEND_ARGS[qualname], "backend")
            if arg is not None:
                self._backend_argument(arg.value, qualname)
        elif qualname in _DEVICE_TYPE_ARGS:
            arg = argument(node, _DEVICE_TYPE_ARGS[qualname], "device_type")
            literal = device_literal(arg.value) if arg is not None else None
            if literal is not None and portable(self.ctx) is None:
                self.report(DEVICE_MESH, literal, "device mesh now built on NPUs", fix=rewrite_device_literal)
            elif literal is not None:
                device = accelerator_type(self.ctx, self.enabled) if string_value(literal) == "cuda" else None
                if device is None:
                    self.report(
                        DEVICE_MESH,
                        literal,
                        f'device mesh left on "cuda": pass `{ACCELERATOR_TYPE}` (this file does not import torch, '
                        "or the torch version cannot spell it)",
                        severity=Severity.WARNING,
                    )
                else:
                    self.report(
                        DEVICE_MESH, literal, "device mesh now built on the current accelerator", fix=lambda u: device
                    )
        elif qualname in _DDP:
            self._ddp(node, _DDP[qualname])
        elif qualname in _DATA_PARALLEL:
            self.report(
                DATA_PARALLEL,
                node.func,
                f"`{qualname}` is not supported on NPU: use DistributedDataParallel with one process per device "
                '(torchrun) and the "hccl" backend',
            )

    def _backend_argument(self, value: cst.BaseExpression, qualname: str) -> None:
        if isinstance(value, cst.IfExp):
            self._backend_argument(value.body, qualname)
            self._backend_argument(value.orelse, qualname)
        elif isinstance(value, (cst.Name, cst.Attribute, cst.Subscript)) and not self._is_none(value):
            self._backend_uses.append(value)
        elif string_value(value) == "gloo" and _DEVICE_TENSORS.search(self.ctx.text):
            # gloo reduces CPU tensors (and CUDA ones, on a CUDA host): not NPU ones. Which tensors reach
            # the collectives is not followed, so this is reported, not rewritten.
            self.report(
                BACKEND,
                value,
                '"gloo" runs collectives on CPU tensors (and on CUDA ones on a CUDA host), not on NPU ones, and this '
                'file puts tensors on the device: where those reach a collective on an NPU, use "cpu:gloo,npu:hccl" '
                '(gloo for CPU tensors, hccl for NPU ones) or "hccl"',
                severity=Severity.WARNING,
            )
        else:
            self._rewrite(value, f"`{qualname.rsplit('.', 1)[-1]}(...)`", at_call=True)
            if replaceable(value) is None and not self._is_none(value):
                self._not_followed(value)

    def _ddp(self, node: cst.Call, positions: list[int]) -> None:
        device_ids = argument(node, positions[0], "device_ids")
        if device_ids is not None and isinstance(device_ids.value, (cst.List, cst.Tuple)):
            for element in device_ids.value.elements:
                literal = device_literal(element.value)
                if literal is not None:
                    self.report(DDP_DEVICES, literal, "DDP device id now names the NPU", fix=rewrite_device_literal)
        # `output_device=` is NPU102's; only the positional spelling is left to this rule.
        output = argument(node, positions[1], "output_device")
        if output is not None and output.keyword is None:
            literal = device_literal(output.value)
            if literal is not None:
                self.report(DDP_DEVICES, literal, "DDP output device now names the NPU", fix=rewrite_device_literal)

    @staticmethod
    def _is_none(node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Name) and node.value == "None"

    def _not_followed(self, node: cst.BaseExpression) -> None:
        self.report(
            BACKEND_NOT_FOLLOWED,
            node,
            f"the process-group backend comes from `{self.ctx.code(node)}`, which npu-migrate cannot follow: make "
            'sure it is "hccl" (or "cpu:gloo,npu:hccl") on NPU, for example in your config files or launch scripts',
        )

    # -- NCCL names ---------------------------------------------------------------------------------

    def visit_Attribute(self, node: cst.Attribute) -> None:
        qualname = _normalized(self.ctx.qualname(node))
        mapping = _RENAMED.get(qualname)
        if mapping is None:
            return
        if "attribute" in mapping:
            self.report(
                NCCL_API,
                node,
                f"`{qualname}` -> `{mapping['attribute']}`",
                fix=lambda updated, name=mapping["attribute"]: updated.with_changes(attr=cst.Name(name)),
            )
            return
        root = torch_npu_root(self.ctx, self.enabled)
        target = mapping["replace"]
        if root is None:
            self.report(
                NCCL_API,
                node,
                f"`{qualname}` has no NPU counterpart under torch.distributed: use `{target}` (after `import torch_npu`)",
                severity=Severity.WARNING,
            )
            return
        new = dotted_node(root + target[len("torch_npu") :])
        self.report(NCCL_API, node, f"`{qualname}` -> `{target}`", fix=lambda updated: new)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        _COMPARISONS.check(self, node)

    # -- after the walk -----------------------------------------------------------------------------

    def finish(self) -> None:
        for use in self._backend_uses:
            values = self._values(use, set())
            for value in values:
                self._rewrite(value, f"`{self.ctx.code(use)}`, the process-group backend")
            if not values or UNKNOWN in values or not all(self._known(v) for v in values if v is not UNKNOWN):
                self._not_followed(use)
        # Imported NCCL names: the import binds the HCCL object under the old local name.
        for binding in self.ctx.imports.bindings.values():
            mapping = _RENAMED.get(_normalized(binding.qualname))
            if mapping is None or "import" not in mapping:
                continue
            target = mapping["import"]
            name = target.rsplit(".", 1)[-1]
            if target.startswith("torch_npu.distributed.") and name not in self.ctx.api.distributed:
                self.report(
                    NCCL_API,
                    binding.line,
                    f"`{binding.qualname}` -> `{target}`, which torch_npu {self.ctx.api.version} does not have",
                    severity=Severity.WARNING,
                )
                continue
            if NCCL_API.id in self.enabled:
                self.ctx.rebind(NCCL_API, binding, target)

    def _values(self, node: cst.BaseExpression, seen: set[str]) -> list[cst.BaseExpression | None]:
        """Every value the file gives the name, attribute or entry `node` reads (UNKNOWN for invisible ones)."""
        if isinstance(node, cst.Name):
            if node.value in seen:
                return []
            seen.add(node.value)
            found = self._names.get(node.value, [UNKNOWN])
        elif isinstance(node, cst.Attribute):
            # `cfg.backend` may be an attribute set in this file or a (dataclass) field declared in a class.
            found = self._attributes.get(node.attr.value, []) + self._names.get(node.attr.value, [])
            found = found or [UNKNOWN]
        elif isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = string_value(node.slice[0].slice.value)
            found = self._entries.get(key, [UNKNOWN]) if key is not None else [UNKNOWN]
        else:
            return [node]
        values: list[cst.BaseExpression | None] = []
        for value in found:
            if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript)) and not self._is_none(value):
                values.extend(self._values(value, seen) or [UNKNOWN])
            else:
                values.append(value)
        return values

    def _known(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.IfExp):
            return self._known(node.body) and self._known(node.orelse)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "field":
            default = keyword(node, "default")
            return default is not None and self._known(default.value)
        return self._is_none(node) or string_value(node) is not None


def _nccl_literals(node: cst.BaseExpression) -> list[cst.CSTNode]:
    elements = [e.value for e in node.elements] if isinstance(node, (cst.Tuple, cst.List, cst.Set)) else [node]
    if any(string_value(e) == "hccl" for e in elements):  # `backend in ("nccl", "hccl")` must not name hccl twice
        return []
    return [e for e in elements if replaceable(e) == "nccl"]


_COMPARISONS = LiteralComparisons(
    BACKEND_COMPARISON,
    literals=_nccl_literals,
    visibly=_mentions_backend,
    fix=_to_hccl,
    rewritten="comparison with the backend now tests for HCCL",
    unsure='comparison of `{other}` with "nccl": if it is a process-group backend, compare with "hccl" instead',
)
