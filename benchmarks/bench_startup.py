"""Start-up: what `npu-migrate apply --check` on one one-line file costs (what pre-commit pays per commit),
beside `python -c pass` and the imports it cannot avoid, measured in the same run.

    python benchmarks/bench_startup.py [--runs 21]

Each command runs `--runs` times in a fresh process, interleaved (so a burst of load hits them all alike);
the table gives the median wall time and its excess over `python -c pass`. Machines here are noisy:
compare the rows of one run, not runs on different days.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable


def commands() -> dict[str, list[str]]:
    return {
        "python -c pass": [PYTHON, "-c", "pass"],
        "import typer (the CLI framework)": [PYTHON, "-c", "import typer"],
        "import pydantic (typer 0.2x coerces every option through it)": [PYTHON, "-c", "import pydantic"],
        "import libcst": [PYTHON, "-c", "import libcst"],
        "import npu_migrate.cli": [PYTHON, "-c", "import npu_migrate.cli"],
        "npu-migrate --version": [PYTHON, "-m", "npu_migrate", "--version"],
        "apply --check, one line, nothing to migrate": [PYTHON, "-m", "npu_migrate", "apply", "--check", "plain.py"],
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
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                start = time.perf_counter()
                subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["python -c pass"])
    print(f"median of {args.runs} runs, Python {sys.version.split()[0]}\n")
    print("| command | median s | over `python -c pass` s |")
    print("|---|---:|---:|")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.3f} | {median - base:+.3f} |")


if __name__ == "__main__":
    main()
