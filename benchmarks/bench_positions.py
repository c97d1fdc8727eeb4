"""What positions cost: libcst's PositionProvider against `npu_migrate.engine.positions.positions_of`.

    python benchmarks/bench_positions.py [--files 40] [--repeat 3]

On the largest `models/*/modeling_*.py` files of the transformers tree (see bench_transformers.py, which
unpacks it), times per file, best of `--repeat`: the parse, a plain `module.code`, PositionProvider over
the whole module, `positions_of` for 20 nodes (a file with findings), and `positions_of` with the
statement spans. Prints the totals and their ratios; single-process, so compare ratios, not times.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from npu_migrate.engine.positions import positions_of

TREE = Path(__file__).resolve().parent / ".cache" / "transformers-5.24.0" / "transformers"


def best(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    files = sorted((TREE / "models").glob("*/modeling_*.py"), key=lambda p: p.stat().st_size, reverse=True)
    files = files[: args.files]
    rng = random.Random(0)
    totals = dict.fromkeys(
        ("parse", "code", "PositionProvider", "positions_of(20 nodes)", "positions_of(statements)"), 0.0
    )
    for path in files:
        source = path.read_text(encoding="utf-8")
        totals["parse"] += best(lambda: cst.parse_module(source), args.repeat)
        module = cst.parse_module(source)
        totals["code"] += best(lambda: module.code, args.repeat)
        reference = {}
        totals["PositionProvider"] += best(
            lambda: reference.update(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)),
            args.repeat,
        )
        wanted = rng.sample(list(reference), 20)
        totals["positions_of(20 nodes)"] += best(lambda: positions_of(module, wanted), args.repeat)
        totals["positions_of(statements)"] += best(lambda: positions_of(module, wanted, statements=True), args.repeat)
        assert positions_of(module, wanted) == {node: reference[node] for node in wanted}
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)
    print(f"{len(files)} files, {lines} lines, best of {args.repeat}")
    print(f"{'':28} {'seconds':>8} {'/ parse':>8} {'/ code':>8} {'/ PositionProvider':>18}")
    for name, seconds in totals.items():
        print(
            f"{name:28} {seconds:8.3f} {seconds / totals['parse']:8.2f} {seconds / totals['code']:8.2f}"
            f" {seconds / totals['PositionProvider']:18.3f}"
        )


if __name__ == "__main__":
    main()
