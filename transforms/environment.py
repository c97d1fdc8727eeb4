"""Environment variables: CUDA / NCCL settings named in Python become their Ascend counterparts.

A variable name is only touched where it is used as one: `os.environ[...]`, `os.environ.get/setdefault/
pop/update`, `os.getenv`, `os.putenv`, `os.unsetenv`, `"X" in os.environ`, and environment dicts (a dict
that unpacks `**os.environ`, the `env=` argument of a call, a variable copied from `os.environ`). A string
that only mentions a variable (a log message, `"MY_CUDA_VISIBLE_DEVICES_NOTE"`) is left alone. Driven by
`data/env_vars.toml`, the table shell-script migration uses too.
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.files import kinds
from npu_migrate.findings import Severity
from npu_migrate.transforms.common.accelerator import portable
from npu_migrate.transforms.common.env_vars import (
    Need,
    both_spellings,
    known_variable,
    verdict,
    visible_devices_problem,
)
from npu_migrate.transforms.common.strings import replaceable, string_value, with_value

RENAMED = Rule(
    id="NPU601",
    name="env-var-renamed",
    family="environment",
    summary="`CUDA_VISIBLE_DEVICES`, `CUDA_LAUNCH_BLOCKING`, `PYTORCH_CUDA_ALLOC_CONF`, `TORCH_NCCL_*` ... get their Ascend names",
    what="""
    Renames the variables whose Ascend counterpart has the same meaning and value syntax, where Python
    code, shell scripts, Dockerfiles, `.env` and YAML files read or set them: `CUDA_VISIBLE_DEVICES` ->
    `ASCEND_RT_VISIBLE_DEVICES`, `CUDA_LAUNCH_BLOCKING` -> `ASCEND_LAUNCH_BLOCKING`,
    `PYTORCH_CUDA_ALLOC_CONF` -> `PYTORCH_NPU_ALLOC_CONF`, `TORCH_NCCL_X` -> `TORCH_HCCL_X` for the
    settings torch_npu implements, `NCCL_SOCKET_IFNAME` -> `HCCL_SOCKET_IFNAME`. `CUDA_VISIBLE_DEVICES`
    is not renamed when the value set is a literal the Ascend runtime would misread (see NPU604). With
    `--target portable` nothing is renamed (the code must keep serving CUDA hosts): each variable is reported
    with the line that sets the Ascend name too, from the CUDA one where the host has not set it
    (`export ASCEND_RT_VISIBLE_DEVICES="${ASCEND_RT_VISIBLE_DEVICES:-$CUDA_VISIBLE_DEVICES}"`).
    """,
    why="""
    The Ascend runtime, HCCL and torch_npu never read the CUDA and NCCL names: the setting is silently
    lost (all devices visible, no blocking launches, the default allocator).
    """,
    example=Example(
        before="""
            import os
            import subprocess

            os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
            subprocess.run(["python", "train.py"], env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"})
        """,
        after="""
            import os
            import subprocess

            os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0,1"
            subprocess.run(["python", "train.py"], env={**os.environ, "ASCEND_LAUNCH_BLOCKING": "1"})
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The value is carried over as it is, to a variable read by the Ascend runtime, HCCL or torch_npu
    instead of CUDA: a setting tuned for the GPU host (an allocator option, a network interface name)
    may need another value on the NPU host.
    """,
    targets=EVERY_TARGET,
)

NEEDS_CONVERSION = Rule(
    id="NPU602",
    name="env-var-needs-conversion",
    family="environment",
    summary="NCCL variables whose HCCL counterpart takes other values (`NCCL_BUFFSIZE` bytes vs MB) are reported",
    what="""
    Reports `NCCL_BUFFSIZE`, `NCCL_ALGO` and `NCCL_TIMEOUT` and leaves them alone; the finding says how
    to convert the value to the HCCL variable.
    """,
    why="""
    Renaming would silently change the setting: `HCCL_BUFFSIZE` is in MB where `NCCL_BUFFSIZE` is in
    bytes, `HCCL_ALGO` has another syntax than `NCCL_ALGO`, and HCCL splits the timeout in two.
    """,
    example=Example(
        before="""
            import os

            os.environ["NCCL_BUFFSIZE"] = str(8 * 1024 * 1024)
        """,
        reports="set HCCL_BUFFSIZE to the value divided by 1048576",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    targets=EVERY_TARGET,
)

NO_EQUIVALENT = Rule(
    id="NPU603",
    name="env-var-no-equivalent",
    family="environment",
    summary="CUDA / NCCL variables without an Ascend counterpart (`NCCL_DEBUG`, `CUBLAS_WORKSPACE_CONFIG` ...) are reported",
    what="""
    Reports settings such as `NCCL_DEBUG`, `NCCL_IB_DISABLE`, `NCCL_P2P_DISABLE`,
    `CUDA_DEVICE_MAX_CONNECTIONS` or `CUBLAS_WORKSPACE_CONFIG` and leaves them alone; the finding says
    what to use instead, if anything.
    """,
    why="""
    Nothing on an NPU host reads them: whatever they were set for (debug logs, determinism, link
    selection) silently does not happen.
    """,
    example=Example(
        before="""
            import os

            os.environ["NCCL_DEBUG"] = "INFO"
        """,
        reports="use ASCEND_GLOBAL_LOG_LEVEL",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    targets=EVERY_TARGET,
)

VISIBLE_DEVICES_ORDER = Rule(
    id="NPU604",
    name="visible-devices-order",
    family="environment",
    summary='Device lists the Ascend runtime misreads (`"3,1"`, `"0, 1"`) are reported',
    what="""
    Reports a literal device list that is not in ascending order or has spaces, and does not rename a
    `CUDA_VISIBLE_DEVICES` holding it (NPU601). Sort the ids and remap the code that relies on their
    order.
    """,
    why="""
    `ASCEND_RT_VISIBLE_DEVICES` must list device ids in ascending order, separated by commas without
    spaces; parsing stops at the first character that breaks the rule, so the process silently sees
    fewer devices. CUDA accepts any order.
    """,
    example=Example(
        before="""
            import os

            os.environ["CUDA_VISIBLE_DEVICES"] = "3,1"
        """,
        reports="in ascending order without spaces",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.ERROR,
    targets=EVERY_TARGET,
)

#: The rule that reports each need of the table, in Python code and launch scripts alike.
RULE_FOR_NEED = {Need.CONVERSION: NEEDS_CONVERSION, Need.NO_EQUIVALENT: NO_EQUIVALENT}

#: Mapping methods whose first argument names a variable (`setdefault`'s second one is its value).
_KEY_METHODS = frozenset({"get", "pop", "setdefault"})
_SITE_WORDS = frozenset({"environ", "getenv", "putenv", "unsetenv", "env"})


class EnvironmentChecker(Checker):
    rules = (RENAMED, NEEDS_CONVERSION, NO_EQUIVALENT, VISIBLE_DEVICES_ORDER)
    # `os.environ`, `os.getenv` / `putenv` / `unsetenv` and `env=` (spaces around the `=` included).
    markers = ("env",)

    @classmethod
    def wants(cls, index) -> bool:
        # A variable the tables know, as a string (`os.environ["X"]`) or as a keyword
        # (`os.environ.update(X=...)`); ASCEND_RT_VISIBLE_DEVICES too, whose value is checked.
        return any(map(known_variable, index.strings)) or any(map(known_variable, index.names))

    @classmethod
    def wants_words(cls, words) -> bool:
        # Every site is reached through one of these identifiers; "environment" or "envelope" is none.
        return not _SITE_WORDS.isdisjoint(words)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        # Variables holding a copy of the environment (`env = os.environ.copy()`), by name.
        self._env_copies: set[str] = set()
        # Sites on such variables, decided once every copy is known.
        self._copy_sites: list[tuple[str, cst.CSTNode, cst.BaseExpression | None, frozenset[str]]] = []
        self._assigned: set[int] = set()  # subscripts already seen as assignment targets, with their value
        # Names bound to variable names (`key, value = "NCCL_ASYNC_ERROR_HANDLING", "1"`, `for name, val in
        # (("NCCL_DEBUG", "INFO"),)`): each binding's string, with the value bound beside it.
        self._bound: dict[str, list[tuple[cst.BaseExpression, cst.BaseExpression | None]]] = {}
        self._name_keys: list[tuple[str, frozenset[str]]] = []  # `os.environ[key]` sites, decided in `finish`

    # -- what is an environment ---------------------------------------------------------------------

    def _is_environ(self, node: cst.BaseExpression) -> bool:
        return self.ctx.qualname(node) == "os.environ"

    def _is_env_copy_expr(self, node: cst.BaseExpression) -> bool:
        """`os.environ.copy()`, `dict(os.environ)`, `{**os.environ, ...}`."""
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "copy" and self._is_environ(func.value):
                return True
            if (
                isinstance(func, cst.Name)
                and func.value == "dict"
                and node.args
                and self._is_environ(node.args[0].value)
            ):
                return True
        if isinstance(node, cst.Dict):
            return any(isinstance(e, cst.StarredDictElement) and self._is_environ(e.value) for e in node.elements)
        return False

    def _is_env(self, node: cst.BaseExpression) -> bool | None:
        """True for `os.environ`; None for a Name that may be a copy of it (decided in `finish`)."""
        if self._is_environ(node):
            return True
        return None if isinstance(node, cst.Name) else False

    # -- sites --------------------------------------------------------------------------------------

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self._bound.setdefault(target.value, []).append((value, None))
        elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
            names, values = [e.value for e in target.elements], [e.value for e in value.elements]
            if len(names) != len(values):
                return
            for index, (name, bound) in enumerate(zip(names, values)):
                if isinstance(name, cst.Name):
                    mate = values[index + 1] if index + 1 < len(values) else None
                    self._bound.setdefault(name.value, []).append((bound, mate))

    def visit_For(self, node: cst.For) -> None:
        if isinstance(node.iter, (cst.Tuple, cst.List)):
            for element in node.iter.elements:
                self._bind(node.target, element.value)
        else:
            self._bind(node.target, node.iter)  # a value it cannot follow: the name is not one string

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)
        if self._is_env_copy_expr(node.value):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self._env_copies.add(target.target.value)
        for target in node.targets:
            self._assigned.add(id(target.target))
            self._subscript(target.target, node.value)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if id(node) not in self._assigned:
            self._subscript(node, None)

    def _subscript(self, node: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if (
            not isinstance(node, cst.Subscript)
            or len(node.slice) != 1
            or not isinstance(node.slice[0].slice, cst.Index)
        ):
            return
        key = node.slice[0].slice.value
        self._site(node.value, key, value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        qualname = self.ctx.qualname(func)
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        if qualname in ("os.getenv", "os.unsetenv") and positional:
            self._key(positional[0], None, frozenset())
        elif qualname == "os.putenv" and positional:
            self._key(positional[0], positional[1] if len(positional) > 1 else None, frozenset())
        elif isinstance(func, cst.Attribute) and func.attr.value in _KEY_METHODS and positional:
            value = positional[1] if func.attr.value == "setdefault" and len(positional) > 1 else None
            self._site(func.value, positional[0], value)
        elif isinstance(func, cst.Attribute) and func.attr.value == "update":
            for arg in node.args:
                self._site(func.value, None, None, update=arg)
        if self._is_env_copy_expr(node) and isinstance(func, cst.Name):  # dict(os.environ, KEY=value)
            for arg in node.args[1:]:
                self._keyword(arg, frozenset())
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "env" and isinstance(arg.value, cst.Dict):
                self._dict(arg.value)

    def visit_Dict(self, node: cst.Dict) -> None:
        if self._is_env_copy_expr(node):
            self._dict(node)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(t.comparator for t in node.comparisons)]
        for index, target in enumerate(node.comparisons):
            if isinstance(target.operator, (cst.In, cst.NotIn)):
                self._site(operands[index + 1], operands[index], None)

    def _site(
        self, env: cst.BaseExpression, key: cst.BaseExpression | None, value, update: cst.Arg | None = None
    ) -> None:
        known = self._is_env(env)
        if known is False:
            return
        if known is None:
            self._copy_sites.append((env.value, key if update is None else update, value, frozenset()))
            return
        if update is not None:
            self._update(update)
        else:
            self._key(key, value, frozenset())

    def _update(self, arg: cst.Arg) -> None:
        if arg.keyword is not None:
            self._keyword(arg, frozenset())
        elif isinstance(arg.value, cst.Dict):
            self._dict(arg.value)

    def _dict(self, node: cst.Dict) -> None:
        keys = frozenset(string_value(e.key) for e in node.elements if isinstance(e, cst.DictElement)) - {None}
        for element in node.elements:
            if isinstance(element, cst.DictElement):
                self._key(element.key, element.value, keys)

    def _keyword(self, arg: cst.Arg, present: frozenset[str]) -> None:
        if arg.keyword is None:
            return
        name = arg.keyword.value
        new = self._judge(arg.keyword, name, arg.value, present)
        if new is not None and portable(self.ctx) is not None:
            self.report(RENAMED, arg.keyword, both_spellings(name, new, kinds.PYTHON), severity=Severity.WARNING)
        elif new is not None:
            self.report(
                RENAMED,
                arg.keyword,
                f"`{name}` is `{new}` on Ascend",
                fix=lambda updated, n=new: updated.with_changes(value=n),
            )

    def _key(self, key: cst.BaseExpression | None, value, present: frozenset[str]) -> None:
        if isinstance(key, cst.Name):
            self._name_keys.append((key.value, present))
            return
        name = replaceable(key)
        if name is None:
            return
        new = self._judge(key, name, value, present)
        if new is not None and portable(self.ctx) is not None:
            self.report(RENAMED, key, both_spellings(name, new, kinds.PYTHON), severity=Severity.WARNING)
        elif new is not None:
            self.report(
                RENAMED,
                key,
                f"`{name}` is `{new}` on Ascend",
                fix=lambda updated, n=new: with_value(updated, n),
            )

    def _judge(self, node: cst.CSTNode, name: str, value, present: frozenset[str]) -> str | None:
        """Report what the variable `name` needs; the new name if it is simply renamed."""
        literal = string_value(value) if value is not None else None
        problem = visible_devices_problem(name, literal) if literal is not None else None
        if problem is not None:
            self.report(VISIBLE_DEVICES_ORDER, value, problem)
            return None
        new, need, advice = verdict(name)
        if new is not None:
            return None if new in present else new
        if need is not None:
            self.report(RULE_FOR_NEED[need], node, f"`{name}`: {advice}")
        return None

    def finish(self) -> None:
        for name, key_or_update, value, present in self._copy_sites:
            if name not in self._env_copies:
                continue
            if isinstance(key_or_update, cst.Arg):
                self._update(key_or_update)
            else:
                self._key(key_or_update, value, present)
        # A variable's name reaching the environment through a variable: decided at the string, when every
        # binding of that variable in the file is a string (the rename is then right wherever it is read).
        for key, present in dict.fromkeys(self._name_keys):
            bindings = self._bound.get(key, [])
            if bindings and all(string_value(literal) is not None for literal, _ in bindings):
                for literal, mate in bindings:
                    self._key(literal, mate, present)
