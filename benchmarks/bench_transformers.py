"""Benchmark npu-migrate on a large real tree, against baselines measured in the same run.

    python benchmarks/bench_transformers.py [--version 5.24.0] [--jobs N] [--skip-baselines] [--skip-analyze]
                                            [--skip-scaling] [--skip-reasons]

Gets the `transformers` wheel from PyPI (pinned, cached in benchmarks/.cache), unpacks it, and times:

* baselines: reading every file; `ast.parse` of every file; a bare libcst `parse_module` + `.code` of
  every file (what parsing everything would cost), on the same number of processes as npu-migrate;
* `npu-migrate apply --diff` over the tree cold (a fresh process, the result cache emptied first), then
  `apply --check` and `apply --diff` warm (answered from the cache the cold run filled, #26), `apply --diff`
  with the fused rules off (`--no-cache`), and `npu-migrate analyze --mode all` cold (cache emptied) and
  warm (its rule findings from the cache; the analysis modes still scan every file);
* `npu-migrate apply --check` on one small file (start-up cost, what pre-commit pays per commit);
* scaling: apply over a quarter, a half and the whole tree.

Reports files, lines, wall and CPU seconds, peak memory (largest process RSS, of the main process or
any worker), the ratios to the baselines (#26's targets: apply --diff cold <= 2x ast.parse, analyze <= 1.5x
apply --diff cold), and which checkers made files get parsed. Writes benchmarks/results/<timestamp>.json and .md
and prints the Markdown table. Machines here are noisy: compare ratios, not single times.
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results"


def fetch_tree(version: str) -> Path:
    target = CACHE / f"transformers-{version}"
    if (target / "transformers").is_dir():
        return target / "transformers"
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            f"transformers=={version}",
            "-d",
            str(CACHE),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wheel = next(CACHE.glob(f"transformers-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target / "transformers"


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


# -- baselines (module-level so worker processes can pickle them) ------------------------------------


def _read(path: str) -> int:
    return len(Path(path).read_bytes())


def _ast(path: str) -> int:
    ast.parse(Path(path).read_bytes())
    return 0


def _libcst(path: str) -> int:
    import libcst

    source = Path(path).read_text(encoding="utf-8")
    assert libcst.parse_module(source).code == source
    return 0


def timed_pool(function, files: list[Path], jobs: int) -> dict:
    start, cpu0 = time.perf_counter(), _cpu()
    paths = [str(p) for p in files]
    if jobs <= 1:
        for p in paths:
            function(p)
    else:
        with ProcessPoolExecutor(jobs) as pool:
            list(pool.map(function, paths, chunksize=8))
    return {"wall_s": time.perf_counter() - start, "cpu_s": _cpu() - cpu0}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_command(args: list[str], cwd: Path) -> dict:
    """A command in a fresh process; peak RSS is the largest process of its tree (via a wrapper)."""
    wrapper = (
        "import resource, subprocess, sys, json, time\n"
        "start = time.perf_counter()\n"
        "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode\n"
        "wall = time.perf_counter() - start\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps({'rc': rc, 'wall_s': wall, 'cpu_s': u.ru_utime + u.ru_stime,"
        " 'peak_rss_mb': u.ru_maxrss / 1024}))\n"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def npu_migrate(*args: str) -> list[str]:
    return [sys.executable, "-m", "npu_migrate", *args]


def parse_reasons(files: list[Path]) -> dict:
    """The prefilter funnel: how many files each stage lets through, and how much code libcst parses.

    Text markers (substrings), then the words of the text (`wants_words`), then the `ast` and its index
    (`wants`). A file some libcst checker still wants is parsed whole; one only tree checkers (the fused
    rules) want is parsed statement by statement, and only where they change something: those lines are
    counted by running that stage here, in this process."""
    import libcst

    from npu_migrate.engine import scoped
    from npu_migrate.engine.astindex import AstIndex, text_words
    from npu_migrate.engine.checkers import TreeChecker
    from npu_migrate.engine.pipeline import migrate_text
    from npu_migrate.engine.registry import all_checkers

    checkers = [c for c in all_checkers() if c.markers]
    by_marker, by_words, by_ast = collections.Counter(), collections.Counter(), collections.Counter()
    whole, whole_lines, scoped_files, ast_parsed = 0, 0, [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        candidates = [c for c in checkers if any(m in text for m in c.markers)]
        by_marker.update(c.__name__ for c in candidates)
        words = text_words(text) if candidates else frozenset()
        candidates = [c for c in candidates if c.wants_words(words)]
        by_words.update(c.__name__ for c in candidates)
        if not candidates:
            continue
        try:
            index = AstIndex.of(ast.parse(text))
        except SyntaxError:
            continue
        ast_parsed += 1
        wanted = [c for c in candidates if c.wants(index)]
        by_ast.update(c.__name__ for c in wanted)
        if any(not issubclass(c, TreeChecker) for c in wanted):
            whole += 1
            whole_lines += text.count("\n")
        elif wanted:
            scoped_files.append(text)

    snippet_lines = 0
    parse = libcst.parse_module

    def counting(code, *args, **kwargs):
        nonlocal snippet_lines
        snippet_lines += code.count("\n")
        return parse(code, *args, **kwargs)

    tree_rules = [r.id for c in checkers if issubclass(c, TreeChecker) for r in c.rules]
    scoped.cst.parse_module = counting
    try:
        for text in scoped_files:
            migrate_text(text, select=tree_rules)
    finally:
        scoped.cst.parse_module = parse
    return {
        "after_text_markers": dict(by_marker),
        "after_words": dict(by_words),
        "ast_parsed": ast_parsed,
        "after_ast_filter": dict(by_ast),
        "libcst_whole_files": whole,
        "libcst_whole_lines": whole_lines,
        "statement_scoped_files": len(scoped_files),
        "statement_scoped_lines": sum(t.count("\n") for t in scoped_files),
        "libcst_snippet_lines": snippet_lines,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="5.24.0", help="transformers version (pinned for reproducibility)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-baselines", action="store_true", help="skip the slow libcst baseline")
    parser.add_argument("--skip-analyze", action="store_true", help="skip `analyze --mode all` (minutes)")
    parser.add_argument("--skip-scaling", action="store_true", help="skip apply over 1/4, 1/2 and all of models/")
    parser.add_argument("--skip-reasons", action="store_true", help="skip the prefilter funnel (parse reasons)")
    parser.add_argument("--skip-fused-off", action="store_true", help="skip apply --diff with the fused rules off")
    args = parser.parse_args()

    root = fetch_tree(args.version)
    files = python_files(root)
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    workdir = root.parent
    results: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "jobs": args.jobs,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            # The machine is shared: the load says how much the timings below are worth.
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        },
        "tree": {"name": f"transformers {args.version}", "files": len(files), "lines": lines},
        "timings": {},
    }
    t = results["timings"]
    t["read every file"] = timed_pool(_read, files, 1)
    t["ast.parse every file"] = timed_pool(_ast, files, args.jobs)
    if not args.skip_baselines:
        t["libcst parse+code every file"] = timed_pool(_libcst, files, args.jobs)
    rel = root.relative_to(workdir).as_posix()
    # The unpacked tree sits in benchmarks/.cache, which git ignores: --no-gitignore, or apply finds nothing.
    jobs = ("--jobs", str(args.jobs), "--no-gitignore")
    # The cache lives in the project root: a pyproject.toml of its own makes it the working folder (else the
    # nearest folder with .git above the tree, this checkout, would hold it).
    (workdir / "pyproject.toml").write_text("[tool.npu-migrate]\n", encoding="utf-8")
    shutil.rmtree(workdir / ".npu_migrate_cache", ignore_errors=True)
    t["apply --diff cold"] = timed_command(npu_migrate("apply", "--diff", *jobs, rel), workdir)
    t["apply --check warm (cache)"] = timed_command(npu_migrate("apply", "--check", *jobs, rel), workdir)
    t["apply --diff warm (cache)"] = timed_command(npu_migrate("apply", "--diff", *jobs, rel), workdir)
    if not args.skip_fused_off:
        t["apply --diff cold (fused off)"] = timed_command(
            npu_migrate("apply", "--diff", "--no-cache", "--ignore", "NPU7", *jobs, rel), workdir
        )
    if not args.skip_analyze:
        analyze = npu_migrate("analyze", "--mode", "all", "--no-gitignore", "--format", "json", *jobs, rel)
        # Cold, and filling the cache (emptied: a file of no package would share apply's entry); then warm,
        # its rule findings from the cache (a package's files have entries of their own: not apply's).
        shutil.rmtree(workdir / ".npu_migrate_cache", ignore_errors=True)
        t["analyze --mode all"] = timed_command(analyze, workdir)
        t["analyze --mode all warm (cache)"] = timed_command(analyze, workdir)

    with tempfile.TemporaryDirectory() as small:
        (Path(small) / "train.py").write_text("import torch\n\nx = torch.ones(2).cuda()\n")
        runs = [timed_command(npu_migrate("apply", "--check", "train.py"), Path(small))["wall_s"] for _ in range(5)]
        bare = [timed_command([sys.executable, "-c", "pass"], Path(small))["wall_s"] for _ in range(5)]
    t["apply --check one small file (median of 5)"] = {"wall_s": statistics.median(runs)}
    t["python -c pass (median of 5)"] = {"wall_s": statistics.median(bare)}

    scaling = {}
    top = sorted({p.relative_to(root).parts[0] for p in files})
    models = sorted((root / "models").iterdir()) if (root / "models").is_dir() else []
    for fraction in () if args.skip_scaling else (0.25, 0.5):
        subset = [m.relative_to(workdir).as_posix() for m in models[: int(len(models) * fraction)]]
        scaling[f"{fraction:.2f} of models/"] = {
            "files": sum(len(python_files(workdir / s)) for s in subset),
            **timed_command(npu_migrate("apply", "--diff", "--no-cache", *jobs, *subset), workdir),
        }
    all_models = [m.relative_to(workdir).as_posix() for m in models]
    if not args.skip_scaling:
        scaling["1.00 of models/"] = {
            "files": sum(len(python_files(workdir / s)) for s in all_models),
            **timed_command(npu_migrate("apply", "--diff", "--no-cache", *jobs, *all_models), workdir),
        }
    results["scaling"] = scaling
    results["parse_reasons"] = None if args.skip_reasons else parse_reasons(files)
    results["top_level_entries"] = len(top)

    ratios = {}
    cold, ast_wall = t["apply --diff cold"]["wall_s"], t["ast.parse every file"]["wall_s"]
    ratios["apply --diff cold / ast.parse (target <= 2)"] = cold / ast_wall
    if "analyze --mode all" in t:
        ratios["analyze --mode all / apply --diff cold (target <= 1.5)"] = t["analyze --mode all"]["wall_s"] / cold
    ratios["apply --check warm / apply --diff cold"] = t["apply --check warm (cache)"]["wall_s"] / cold
    base = t.get("libcst parse+code every file", {}).get("wall_s")
    for name in ("apply --diff cold", "apply --diff cold (fused off)", "analyze --mode all"):
        if name in t and base:
            ratios[f"{name} / libcst parse"] = t[name]["wall_s"] / base
    base_cpu = t.get("libcst parse+code every file", {}).get("cpu_s")
    for name in ("apply --diff cold", "apply --diff cold (fused off)"):
        if base_cpu and name in t and t[name].get("cpu_s"):
            ratios[f"{name} / libcst parse, CPU seconds"] = t[name]["cpu_s"] / base_cpu
    ratios["apply --check small / python start-up"] = (
        t["apply --check one small file (median of 5)"]["wall_s"] / t["python -c pass (median of 5)"]["wall_s"]
    )
    results["peak_rss_mb"] = max(r.get("peak_rss_mb", 0) for r in [*t.values(), *scaling.values()])
    results["ratios"] = ratios

    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"{stamp}.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (RESULTS / f"{stamp}.md").write_text(table)
    print(table)


def markdown(results: dict) -> str:
    tree, machine = results["tree"], results["machine"]
    out = [
        f"{tree['name']}: {tree['files']} files, {tree['lines']:,} lines; {machine['cpus']} CPUs "
        f"({machine['processor']}), {machine['jobs']} jobs, Python {machine['python']}; load average at the "
        f"start {machine['load_average']}",
        "",
        "| task | wall s | CPU s | peak RSS MB |",
        "|---|---|---|---|",
    ]
    for name, r in results["timings"].items():
        rss = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else ""
        cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else ""
        out.append(f"| {name} | {r['wall_s']:.2f} | {cpu} | {rss} |")
    out += ["", "| ratio | value |", "|---|---|"]
    out += [f"| {name} | {value:.3f} |" for name, value in results["ratios"].items()]
    out += ["", f"Peak memory, largest process of any run above: {results['peak_rss_mb']:.0f} MB."]
    if results["scaling"]:
        out += ["", "| scaling (apply --diff, no cache) | files | wall s | peak RSS MB |", "|---|---|---|---|"]
        out += [
            f"| {name} | {r['files']} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} |"
            for name, r in results["scaling"].items()
        ]
    r = results["parse_reasons"]
    if r is None:
        return "\n".join([*out, ""])
    out += [
        "",
        f"Prefilters: {r['ast_parsed']} of {tree['files']} files reach `ast.parse`; after the ast filter, by "
        f"checker: {r['after_ast_filter']}.",
        f"libcst parses {r['libcst_whole_files']} files whole ({r['libcst_whole_lines']:,} lines) and, in "
        f"{r['statement_scoped_files']} files ({r['statement_scoped_lines']:,} lines) only the fused rules want, "
        f"{r['libcst_snippet_lines']:,} lines of the statements they rewrite.",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    main()
