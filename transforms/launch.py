"""Launch scripts, Dockerfiles, .env and YAML configs: the environment-variable table and `nvidia-smi`.

Options a launcher passes to the training script (`--backend nccl`, `--device cuda:0`) follow the
Python rules' ids (NPU301, NPU102). These files are not Python, so they are read line by line (`npu_migrate.engine.textfiles`): names are matched
as whole tokens and never inside comments. Variables follow the same table as Python code
(`data/env_vars.toml`, rules NPU601-NPU604), so one place says what `CUDA_VISIBLE_DEVICES` becomes.
"""

from __future__ import annotations

import re

from npu_migrate.engine.checkers import TextChecker
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.engine.textfiles import TextReport, is_prose, split_lines, token
from npu_migrate.files import kinds
from npu_migrate.findings import Severity
from npu_migrate.transforms.common.env_vars import NAMED, PREFIXES, both_spellings, verdict, visible_devices_problem

# The rules of other families whose ids findings in launch scripts carry (declarations, not helpers).
from npu_migrate.transforms.device import DEVICE_STRING
from npu_migrate.transforms.distributed import BACKEND
from npu_migrate.transforms.environment import RENAMED, RULE_FOR_NEED, VISIBLE_DEVICES_ORDER

NVIDIA_SMI = Rule(
    id="NPU605",
    name="nvidia-smi",
    family="launch",
    summary="`nvidia-smi` in launch scripts becomes `npu-smi info`; calls with options are reported",
    what="""
    In launch scripts, Dockerfiles, `.env` and YAML files, a bare `nvidia-smi` (a status printout)
    becomes `npu-smi info`. Calls with options (`nvidia-smi --query-gpu=...`, `$(nvidia-smi -L | wc -l)`)
    are reported with the npu-smi command to use instead (`npu-smi info -l` lists the NPUs and their
    count), and left as they are.
    """,
    why="""
    An NPU host has no `nvidia-smi`: the command fails, and a script running with `set -e` stops there.
    """,
    example=Example(
        path="train.sh",
        before="""
            nvidia-smi
            torchrun --nproc_per_node=$(nvidia-smi -L | wc -l) train.py
        """,
        after="""
            npu-smi info
            torchrun --nproc_per_node=$(nvidia-smi -L | wc -l) train.py
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    `npu-smi info` prints another table than `nvidia-smi`: anything that reads the printout (a pipe into
    grep, a log parser) must be adapted.
    """,
    severity=Severity.WARNING,
)

_NAMES = re.compile(
    r"(?<![A-Za-z0-9_])(?:"
    + "|".join(re.escape(n) for n in sorted(NAMED, key=len, reverse=True))
    + "|(?:"
    + "|".join(re.escape(p) for p in PREFIXES)
    + ")[A-Z0-9_]+"
    + r")(?![A-Za-z0-9_])"
)
# The value right after a variable: `NAME=v`, `NAME: v`, Dockerfile `ENV NAME v`; quotes optional.
_VALUE = re.compile(r"""\s*(?:=|:[ \t]+|[ \t]+)["']?([0-9][0-9, ]*[0-9]|[0-9])["']?""")
_SMI = token("nvidia-smi", word="A-Za-z0-9_-")
# Command-line options that hand a backend or a device to the training script (`--backend nccl`).
_BACKEND_OPTION = re.compile(r"--(?:dist[-_])?backend(?:=|[ \t]+)[\"']?(nccl)(?![\w-])")
_DEVICE_OPTION = re.compile(r"--device(?:=|[ \t]+)[\"']?(cuda)(?::\d+)?(?![\w-])")
_END_OF_COMMAND = re.compile(r"\s*($|[;|&)`]|\\$)")


class LaunchChecker(TextChecker):
    rules = (NVIDIA_SMI, BACKEND, DEVICE_STRING)
    kinds = frozenset({kinds.SHELL, kinds.DOCKERFILE, kinds.DOTENV, kinds.YAML})

    def check(self, text: str, kind: str) -> list[TextReport]:
        reports: list[TextReport] = []
        for line in split_lines(text):
            code = line.code
            for match in _NAMES.finditer(code):
                if not is_prose(code, match.start(), match.end()):
                    reports.extend(self._variable(line, match, kind))
            for match in _SMI.finditer(code):
                if not is_prose(code, match.start(), match.end()):
                    reports.append(self._nvidia_smi(line, match))
            for pattern, rule, new in ((_BACKEND_OPTION, BACKEND, "hccl"), (_DEVICE_OPTION, DEVICE_STRING, "npu")):
                for match in pattern.finditer(code):
                    reports.append(self._option(line, match, rule, new))
        return [r for r in reports if r.rule.id in self.enabled]

    def _option(self, line, match, rule, new: str) -> TextReport:
        col = match.start(1) + 1
        if self.target == "portable":  # the script must keep serving CUDA hosts: a human decides per host
            return TextReport(
                rule,
                line.number,
                col,
                f"`{match.group(1)}` option value left as is: on an Ascend host it must be `{new}`; pass it from "
                "the host's environment, or leave the option out where the program picks the accelerator",
                Severity.WARNING,
            )
        span = (line.start + match.start(1), line.start + match.end(1))
        return TextReport(
            rule, line.number, col, f"`{match.group(1)}` option value -> `{new}`", Severity.INFO, span, new
        )

    def _variable(self, line, match, kind: str) -> list[TextReport]:
        name, col = match.group(0), match.start() + 1
        value = _VALUE.match(line.code, match.end())
        if value is not None:
            problem = visible_devices_problem(name, value.group(1))
            if problem is not None:
                return [TextReport(VISIBLE_DEVICES_ORDER, line.number, col, problem, VISIBLE_DEVICES_ORDER.severity)]
        new, need, advice = verdict(name)
        if new is not None and self.target == "portable":
            return [TextReport(RENAMED, line.number, col, both_spellings(name, new, kind), Severity.WARNING)]
        if new is not None:
            span = (line.start + match.start(), line.start + match.end())
            return [
                TextReport(RENAMED, line.number, col, f"`{name}` is `{new}` on Ascend", RENAMED.severity, span, new)
            ]
        if need is not None:
            rule = RULE_FOR_NEED[need]
            return [TextReport(rule, line.number, col, f"`{name}`: {advice}", rule.severity)]
        return []

    def _nvidia_smi(self, line, match) -> TextReport:
        col = match.start() + 1
        if _END_OF_COMMAND.match(line.code, match.end()):
            span = (line.start + match.start(), line.start + match.end())
            return TextReport(
                NVIDIA_SMI, line.number, col, "`nvidia-smi` -> `npu-smi info`", Severity.INFO, span, "npu-smi info"
            )
        return TextReport(
            NVIDIA_SMI,
            line.number,
            col,
            "`nvidia-smi` with options: npu-smi takes other ones. Use `npu-smi info` for status, `npu-smi info -l` "
            "to list NPUs (and count them), `npu-smi info -t usages -i <id>` for utilisation",
            Severity.WARNING,
        )
