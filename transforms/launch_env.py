"""Training speed in the launch environment: the Ascend performance variables, in scripts that set their environment.

A launch script that exports variables before it starts training (`export X=...`, then `torchrun` /
`python` / `deepspeed` / `accelerate launch`), or a Dockerfile with `ENV` lines, gets the variables
Ascend's training tuning guides recommend, each with its comment, after its last such line before the
launch. Sources (public Ascend documentation):

* `TASK_QUEUE_ENABLE=2`: the operator-dispatch task queue's second pipeline level, for host-bound
  training (Ascend Extension for PyTorch 6.0.RC3 training migration guide, performance_tuning_0056;
  MindStudio "Pipeline Optimization": peak NPU memory may grow).
* `CPU_AFFINITY_CONF=1`: coarse core binding, the host's cores split evenly over the NPUs (the same
  guide; PyTorch 7.0.0 features guide featuresguide_00010: mode 1 since 6.0.RC2, overrides `taskset`).
* `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`: the caching allocator's expandable segments, less
  fragmentation (CANN environment variable reference envref_07_0053: needs Ascend HDK 23.0.0 or newer,
  not with a non-default `max_split_size_mb` / `garbage_collection_threshold`, and before HDK 24.1.RC3 not
  with one process driving several NPUs).

NCCL variables get their HCCL names from NPU601-NPU603 (`environment.py`, `data/env_vars.toml`), not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npu_migrate.engine.checkers import TextChecker
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.engine.textfiles import TextReport, split_lines
from npu_migrate.files import kinds
from npu_migrate.findings import Severity


@dataclass(frozen=True)
class Variable:
    name: str
    value: str
    why: str
    #: Variables whose presence means the script already decided this (then nothing is added).
    decided_by: tuple[str, ...] = ()


VARIABLES = (
    Variable("TASK_QUEUE_ENABLE", "2", "operator dispatch in a two-level pipeline (host-bound training)"),
    Variable("CPU_AFFINITY_CONF", "1", "bind each NPU's process to its share of the host's cores"),
    Variable(
        "PYTORCH_NPU_ALLOC_CONF",
        "expandable_segments:True",
        "expandable allocator segments: less memory fragmentation",
        ("PYTORCH_CUDA_ALLOC_CONF",),
    ),
)

TRAINING_ENV = Rule(
    id="NPU606",
    name="ascend-training-env",
    family="launch_env",
    summary="launch scripts and Dockerfiles that set their environment get Ascend's training performance variables (opt-in)",
    what="""
    In a shell script that exports variables before it launches training (`torchrun`, `python`,
    `deepspeed`, `accelerate launch`, `mpirun`), writes `TASK_QUEUE_ENABLE=2`, `CPU_AFFINITY_CONF=1` and
    `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`, each exported with a comment, after the last
    `export` before the launch; in a Dockerfile with `ENV` lines, as `ENV` lines after the last one. A
    variable the file sets already (or, for the allocator, `PYTORCH_CUDA_ALLOC_CONF`, which NPU601
    renames) is left as it is. Scripts that set nothing, and `.env` / YAML files, are not touched.
    Not selected by `ALL`: select it by id (`--select ALL,NPU606`).
    """,
    why="""
    Ascend's training tuning guides recommend them for host-bound training (the task queue's second
    level, core binding) and for memory fragmentation (expandable segments). They change no result, but
    each changes how the host runs: the second task-queue level can raise peak NPU memory, core binding
    overrides `taskset`, and expandable segments need Ascend HDK 23.0.0 or newer: this is why the rule is
    opt-in.
    """,
    example=Example(
        path="train.sh",
        before="""
            export MASTER_PORT=29500
            torchrun --nproc_per_node 8 train.py
        """,
        after="""
            export MASTER_PORT=29500
            # npu-migrate NPU606: Ascend training performance variables
            export TASK_QUEUE_ENABLE=2  # operator dispatch in a two-level pipeline (host-bound training)
            export CPU_AFFINITY_CONF=1  # bind each NPU's process to its share of the host's cores
            export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True  # expandable allocator segments: less memory fragmentation
            torchrun --nproc_per_node 8 train.py
        """,
    ),
    valid=(
        """
        torchrun --nproc_per_node 8 train.py
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    `TASK_QUEUE_ENABLE=2` can raise peak NPU memory; `CPU_AFFINITY_CONF=1` replaces any `taskset` /
    `numactl` binding; expandable segments need Ascend HDK 23.0.0 or newer and, before HDK 24.1.RC3, one
    NPU per process. Measure with and without.
    """,
    tags=frozenset({"lever", "opt-in"}),
)

_EXPORT = re.compile(r"^\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=")
_ENV = re.compile(r"^\s*ENV\s+([A-Za-z_][A-Za-z0-9_]*)[=\s]")
_LAUNCH = re.compile(r"(?<![\w-])(torchrun|python3?|deepspeed|accelerate|mpirun|srun)(?![\w-])")
_MARK = "npu-migrate NPU606"
_FROM = re.compile(r"^\s*FROM\s", re.IGNORECASE)
# Shell compound commands (and function bodies) that open and close a block, as whole words at a command's start.
_OPENS = re.compile(r"(?:^|[;&|(]\s*|\bthen\s+|\bdo\s+)(?:if|for|while|until|case|select)\b|\{\s*$")
_CLOSES = re.compile(r"(?:^|[;&|]\s*)\s*(?:fi|done|esac|\})(?=\s|;|$)")


class LaunchEnvChecker(TextChecker):
    rules = (TRAINING_ENV,)
    kinds = frozenset({kinds.SHELL, kinds.DOCKERFILE})

    def check(self, text: str, kind: str) -> list[TextReport]:
        if TRAINING_ENV.id not in self.enabled or self.target != "npu" or _MARK in text:
            return []
        lines = split_lines(text)
        setter = _ENV if kind == kinds.DOCKERFILE else _EXPORT
        last = first = None
        depth = 0  # shell blocks open at this line: an export inside `if ... fi` is conditional
        for index, line in enumerate(lines):
            if kind == kinds.SHELL and _LAUNCH.search(line.code) and not setter.match(line.code):
                break
            if kind == kinds.DOCKERFILE and _FROM.match(line.code):
                last = first = None  # a new stage: only the last one's environment reaches training
            opened = depth
            if kind == kinds.SHELL:
                depth = max(0, depth + len(_OPENS.findall(line.code)) - len(_CLOSES.findall(line.code)))
            if setter.match(line.code) and opened == 0:
                last = first = index
                while lines[last].text.rstrip().endswith("\\") and last + 1 < len(lines):
                    last += 1  # a continued `ENV A=1 \` / `export A=1 \`
        else:
            if kind == kinds.SHELL:
                return []  # no launch: an environment file another script sources
        if last is None:
            return []
        present = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
        missing = [v for v in VARIABLES if v.name not in present and not present & set(v.decided_by)]
        if not missing:
            return []
        anchor = lines[last]
        indent = re.match(r"\s*", lines[first].text).group(0)
        if kind == kinds.DOCKERFILE:
            # A Dockerfile comment must have a line of its own.
            body = [
                line for v in missing for line in (f"{indent}# {_MARK}: {v.why}", f"{indent}ENV {v.name}={v.value}")
            ]
        else:
            body = [f"{indent}# {_MARK}: Ascend training performance variables"]
            body += [f"{indent}export {v.name}={v.value}  # {v.why}" for v in missing]
        newline = "\r\n" if text[anchor.start + len(anchor.text) :].startswith("\r\n") else "\n"
        end = anchor.start + len(anchor.text)
        at_end = end >= len(text)
        insert = (newline if at_end else "") + newline.join(body) + ("" if at_end else newline)
        position = end if at_end else end + len(newline)
        names = ", ".join(v.name for v in missing)
        return [
            TextReport(
                TRAINING_ENV,
                # where the edit is (sorted after the anchor line's own edits, which must not be dropped)
                anchor.number if at_end else anchor.number + 1,
                len(anchor.text) + 1 if at_end else 1,
                f"sets Ascend's training performance variables after the script's environment: {names}",
                Severity.INFO,
                (position, position),
                insert,
            )
        ]
