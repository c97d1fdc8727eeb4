"""NPU703's recall on rotary embeddings in code nobody here wrote the rule for, pinned and repeatable.

    python benchmarks/rotary_recall.py [PACKAGE ...] [--cache DIR] [--discover] [--json]

Downloads each pinned package (`PACKAGES`) from PyPI with `pip download --no-deps` into a cache folder
(benchmarks/.cache/rotary by default), unpacks the wheel or sdist there, and runs NPU703 through the
engine (`migrate_text` on each file, by its real path, so helpers imported from sibling modules are
followed) on the files that hold a known rotary site. The tool never imports the code it migrates, so
nothing is installed and no dependency is needed. Prints, per package: the known rotary functions, how
many are fused, declined (with the reason) and silent; `--discover` also lists the functions outside the
list that look like a rotary embedding (a product with a cos/sin/freqs table and a rotation), to grow it.

The known sites (`rotary_sites.csv`: package, file, function, the status measured when it was added) are
our own data, a list of locations; no third-party code is copied. tests/test_rotary_recall.py runs this on
a subset and fails when fewer sites are fused than the list records.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITES = HERE / "rotary_sites.csv"
CACHE = HERE / ".cache" / "rotary"

#: PyPI name -> pinned version. The versions the sites in `rotary_sites.csv` were measured on.
PACKAGES = {
    "timm": "1.0.31",
    "litgpt": "0.5.13",
    "local-attention": "1.11.2",
    "torchtune": "0.6.1",
    "mistral-inference": "1.6.0",
    "llama-models": "0.3.0",
    "palm-rlhf-pytorch": "0.8.0",
    "x-transformers": "2.31.10",
    "rotary-embedding-torch": "0.9.1",
    # beyond last session's list (open-clip-torch 3.3.0 and memorizing-transformers-pytorch 0.4.1 were
    # tried too: no rotary embedding applied in either)
    "torchtitan": "0.3.0",
    "ai2-olmo": "0.6.0",
    "megatron-core": "0.19.2",
    "ring-attention-pytorch": "0.5.20",
    "colt5-attention": "0.11.2",
    "recurrent-memory-transformer-pytorch": "0.7.0",
    "vit-pytorch": "1.26.11",
    "toolformer-pytorch": "0.0.30",
    "liger-kernel": "0.8.5",
    "diffusers": "0.42.1",
    # the rotary sites fused_recall.py's packages hold (issue #23's recall runs)
    "k-diffusion": "0.1.1.post1",
    "audiocraft": "1.3.0",
    "fair-esm": "2.0.0",
    "stable-audio-tools": "0.0.20",
    "mmpretrain": "1.2.0",
}


@dataclass(frozen=True)
class Site:
    package: str
    file: str  # relative to the unpacked distribution's root
    function: str  # qualified within the file: `Class.method` or `function`
    expected: str  # fused / declined / silent, when it was added


def known_sites() -> list[Site]:
    with SITES.open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if not row["package"].startswith("#")]
    return [Site(r["package"], r["file"], r["function"], r["expected"]) for r in rows]


def fetch(package: str, cache: Path = CACHE, version: str | None = None) -> Path:
    """The unpacked distribution of the pinned `package` (downloaded once; later runs read the cache);
    `version` for a package pinned elsewhere (fused_recall.py's)."""
    version = version or PACKAGES[package]
    root = cache / f"{package}-{version}"
    if (root / ".complete").exists():
        return root
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--ignore-requires-python",
        "--quiet",
        "-d",
        str(downloads),
    ]
    subprocess.run([*command, f"{package}=={version}"], check=True, capture_output=True, text=True)
    stem = re.sub(r"[-_.]+", "[-_.]", package)
    archive = next(
        p
        for p in sorted(downloads.iterdir())
        if re.match(rf"(?i){stem}-{re.escape(version)}[-.]", p.name) and p.suffix in (".whl", ".gz", ".zip")
    )
    root.mkdir(parents=True, exist_ok=True)
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(root)
    else:
        with tarfile.open(archive) as tarred:
            tarred.extractall(root, filter="data")
        # an sdist unpacks into `<name>-<version>/`: the sites are relative to what is inside
        (inner,) = [p for p in root.iterdir() if p.is_dir()]
        for child in inner.iterdir():
            child.rename(root / child.name)
        inner.rmdir()
    (root / ".complete").write_text(archive.name)
    return root


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Every function of a module by its qualified name in the file (`Class.method`, `outer.inner`)."""
    found: dict[str, ast.FunctionDef] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(prefix + node.name, node)
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            else:
                for block in ("body", "orelse", "finalbody"):
                    walk(getattr(node, block, []) or [], prefix)

    walk(tree.body, "")
    return found


_TABLE = re.compile(r"\*\s*\(?\s*(\w+\.)?(\w*(cos|sin|freqs|rope|rot)\w*|f\b)|view_as_complex\(")
_ROTATION = re.compile(r"rotate|rot\(|view_as_complex|\[\.\.\., *[01]\]|\bx1\b|\bx2\b")


def _looks_rotary(text: str, node: ast.FunctionDef) -> bool:
    """A product with a cos/sin/freqs table and a rotation: what a person would call a rotary embedding
    (`--discover` only: the recall counts the list, never this guess)."""
    segment = ast.get_source_segment(text, node) or ""
    return bool(_TABLE.search(segment) and _ROTATION.search(segment))


def migrate(path: Path) -> tuple[dict[int, tuple[str, str]], str]:
    """NPU703's findings in `path` by line: (status, message); and the file's text."""
    from npu_migrate.engine.pipeline import migrate_text

    text = path.read_text(encoding="utf-8", errors="replace")
    _, findings = migrate_text(text, path=str(path), select=["NPU703"])
    found = {}
    for f in findings:
        if f.rule_id == "NPU703" and "helpers" not in f.message.split(" ", 2)[1]:
            found[f.line] = ("fused" if f.fixed else "declined", f.message)
    return found, text


def status(findings: dict[int, tuple[str, str]], node: ast.FunctionDef) -> tuple[str, str]:
    # A finding is reported at the `def` line (or a statement of the body, for a branch before a tail).
    lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
    for line in lines:
        if line in findings:
            return findings[line]
    return "silent", ""


def measure(packages: list[str], cache: Path = CACHE, discover: bool = False) -> dict[str, dict]:
    """Per package: its known sites with their status and reason (and with `discover`, the look-alikes)."""
    by_package: dict[str, list[Site]] = {}
    for site in known_sites():
        by_package.setdefault(site.package, []).append(site)
    report: dict[str, dict] = {}
    for package in packages:
        root = fetch(package, cache)
        rows, seen = [], set()
        files = sorted({s.file for s in by_package.get(package, [])})
        if discover:
            files = sorted({*files, *(str(p.relative_to(root)) for p in root.rglob("*.py"))})
        for name in files:
            path = root / name
            text = path.read_text(encoding="utf-8", errors="replace")
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            functions = _functions(tree)
            wanted = {s.function: s for s in by_package.get(package, []) if s.file == name}
            extra = [q for q, n in functions.items() if q not in wanted and _looks_rotary(text, n)] if discover else []
            if not wanted and not extra:
                continue
            findings, _ = migrate(path)
            for qualified, site in wanted.items():
                node = functions.get(qualified)
                got, why = ("missing", "no such function") if node is None else status(findings, node)
                rows.append({"file": name, "function": qualified, "status": got, "expected": site.expected, "why": why})
                seen.add((name, qualified))
            for qualified in extra:
                got, why = status(findings, functions[qualified])
                rows.append({"file": name, "function": qualified, "status": got, "expected": "", "why": why})
        known = [r for r in rows if r["expected"]]
        report[package] = {
            "version": PACKAGES[package],
            "known": len(known),
            "fused": sum(r["status"] == "fused" for r in known),
            "declined": sum(r["status"] == "declined" for r in known),
            "silent": sum(r["status"] == "silent" for r in known),
            "rows": rows,
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help=f"PyPI names (default: all of {', '.join(PACKAGES)})")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the downloads are unpacked")
    parser.add_argument("--discover", action="store_true", help="also list look-alikes outside the known sites")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    packages = args.packages or list(PACKAGES)
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown:
        parser.error(f"not pinned here: {', '.join(unknown)}")
    report = measure(packages, args.cache, args.discover)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    total = {"known": 0, "fused": 0, "declined": 0, "silent": 0}
    for package, entry in report.items():
        for key in total:
            total[key] += entry[key]
        print(
            f"{package}=={entry['version']}: {entry['known']} known, {entry['fused']} fused, "
            f"{entry['declined']} declined, {entry['silent']} silent"
        )
        for row in entry["rows"]:
            mark = "" if row["expected"] else "  [not in the list]"
            why = f": {row['why']}" if row["status"] == "declined" else ""
            print(f"  {row['status']:8} {row['file']}::{row['function']}{mark}{why}")
    print(
        f"total: {total['known']} known, {total['fused']} fused, {total['declined']} declined, {total['silent']} silent"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
