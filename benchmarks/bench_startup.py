"""Start-up: what `npu-migrate apply --check` on one one-line file costs (what pre-commit pays per commit),
beside `python -c pass` and the imports it cannot avoid, measured in the same run.

    python benchmarks/bench_startup.py [--runs 21]

Each command runs `--runs` times in a fresh process, interleaved (so a burst of load hits them all alike);
the table gives the median wall time and CPU time (user + system) and the wall time's excess over
`python -c pass`; the last lines give the target's figure (#16: the one-file `--check` under 0.3 s median,
ratio to `python -c pass` beside it). Machines here are noisy: compare the rows of one run, not runs on
different days; on a loaded machine the CPU column says more than the wall one. The commands run with
bytecode caching on (PYTHONDONTWRITEBYTECODE removed), as an installed package runs: the first run of
each writes the caches, the median does not see it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable
TARGET_S = 0.3
CHECK = "apply --check, one line, nothing to migrate"


def commands() -> dict[str, list[str]]:
    return {
        "python -c pass": [PYTHON, "-c", "pass"],
        "import typer (the CLI framework)": [PYTHON, "-c", "import typer"],
        "import pydantic (typer 0.2x coerces every option through it)": [PYTHON, "-c", "import pydantic"],
        "import libcst": [PYTHON, "-c", "import libcst"],
        "import npu_migrate.cli.app": [PYTHON, "-c", "import npu_migrate.cli.app"],
        "npu-migrate --version": [PYTHON, "-m", "npu_migrate", "--version"],
        CHECK: [PYTHON, "-m", "npu_migrate", "apply", "--check", "plain.py"],
        "apply --check, one line of CUDA": [PYTHON, "-m", "npu_migrate", "apply", "--check", "cuda.py"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        (cwd / "plain.py").write_text("x = 1\n")
        (cwd / "cuda.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
        cmds = commands()
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        times: dict[str, list[float]] = {name: [] for name in cmds}
        cpu: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                times[name].append(time.perf_counter() - start)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    base = statistics.median(times["python -c pass"])
    print(f"median of {args.runs} runs, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| command | median wall s | median CPU s | wall over `python -c pass` s |")
    print("|---|---:|---:|---:|")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.3f} | {statistics.median(cpu[name]):.3f} | {median - base:+.3f} |")
    check = statistics.median(times[CHECK])
    verdict = "met" if check < TARGET_S else "not met"
    print(
        f"\none-file `apply --check`: {check:.3f} s median (CPU {statistics.median(cpu[CHECK]):.3f} s) beside "
        f"`python -c pass` {base:.3f} s (CPU {statistics.median(cpu['python -c pass']):.3f} s), "
        f"ratio {check / base:.1f}; target < {TARGET_S} s: {verdict}"
    )


if __name__ == "__main__":
    main()
