"""Recall of the fused-op rules other than rotary on code nobody here wrote them for, pinned and repeatable.

    python benchmarks/fused_recall.py [PACKAGE ...] [--rule NPU701 ...] [--discover] [--json]

The same measurement as `rotary_recall.py` (whose download, unpacking and function index this reuses:
one place for them), for hand-written RMSNorm (NPU701) and `nn.RMSNorm` (NPU706), SwiGLU (NPU702) and
hand-written attention (NPU704). Each pinned package (`PACKAGES`: rotary_recall's and more from the
PyTorch model ecosystem) is downloaded with `pip download --no-deps` into the cache, never installed or
imported, and the selected rules are run through the engine (`migrate_text`, each file by its real path)
on the files holding a known site. Prints per rule and package the known sites fused, declined (with the
reason) and silent; `--discover` also lists functions outside the list that look like one of the ops
(a guess by text, to grow the list; the recall counts the list only).

The known sites (`fused_sites.csv`: rule, package, file, function, the status measured when it was
added) are our own data, a list of locations; no third-party code is copied. A site of NPU703 stays in
`rotary_sites.csv`. tests/test_fused_recall.py runs this on a subset and fails when fewer sites are
fused than the list records.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import rotary_recall  # noqa: E402  (the download and function index live there)

SITES = HERE / "fused_sites.csv"
CACHE = rotary_recall.CACHE  # one cache: the rotary benchmark's packages are measured here too

#: PyPI name -> pinned version: rotary_recall's packages and these, none of them transformers (nanotron 0.4
#: and vector-quantize-pytorch 1.32.0 were tried too: no site of these ops outside Triton kernels; mamba-ssm's
#: sdist needs a CUDA build even to download).
PACKAGES = {
    **rotary_recall.PACKAGES,
    "open-clip-torch": "3.3.0",
    "k-diffusion": "0.1.1.post1",
    "xlstm": "2.0.6",
    "flash-linear-attention": "0.6.0",
    "fair-esm": "2.0.0",
    "denoising-diffusion-pytorch": "2.3.4",
    "stable-audio-tools": "0.0.20",
    "audiocraft": "1.3.0",
    "mmpretrain": "1.2.0",
    "alphafold3-pytorch": "0.8.3",
}

#: The rules measured here and what they recognise.
RULES = {
    "NPU701": "hand-written RMSNorm",
    "NPU702": "SwiGLU",
    "NPU704": "hand-written attention",
    "NPU706": "nn.RMSNorm",
}
#: Findings that are not about a site: the helpers added once per file, SDPA left to native dispatch
#: (kept apart, under `NATIVE`: it makes a hand-written fallback beside the call "native").
_NOT_A_SITE = re.compile(r"^fused-op helpers")
_SDPA = "scaled_dot_product_attention"
NATIVE = "NPU704 native"


#: What a site's status can be: a branch, a finding saying why not, left to native SDPA (NPU704), nothing.
STATUSES = ("fused", "declined", "native", "silent")


@dataclass(frozen=True)
class Site:
    rule: str
    package: str
    file: str  # relative to the unpacked distribution's root
    function: str  # qualified within the file: `Class.method` or `function`
    expected: str  # one of STATUSES, when it was added


def known_sites() -> list[Site]:
    with SITES.open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if not row["rule"].startswith("#")]
    return [Site(r["rule"], r["package"], r["file"], r["function"], r["expected"]) for r in rows]


def fetch(package: str, cache: Path = CACHE) -> Path:
    return rotary_recall.fetch(package, cache, version=PACKAGES[package])


# `--discover`'s guesses, by text: what a person would call each op.
_LOOKS = {
    "NPU701": lambda s: (
        bool(
            re.search(r"\brsqrt\(|\brms_norm\(", s)
            or (re.search(r"normalize\(", s) and re.search(r"\*\*\s*0?\.5|sqrt\(|\.scale\b", s))
            or (re.search(r"pow\(2\)|\*\*\s*2\b|square\(", s) and re.search(r"mean\(", s) and "sqrt(" in s)
        )
        and "softmax(" not in s
    ),
    "NPU702": lambda s: bool(
        re.search(r"\bsilu\(|SiLU\(|swish\(|\bglu\(", s) and re.search(r"\*\s*\w|chunk\(|glu\(", s)
    ),
    "NPU704": lambda s: bool(re.search(r"softmax\(", s) and re.search(r"@|matmul\(|einsum\(|bmm\(", s)),
    "NPU706": lambda s: bool(re.search(r"\bnn\.RMSNorm\(", s)),
}
#: Where no model code lives: optimizers' and schedulers' square roots are no RMSNorm.
_NOT_MODEL_CODE = re.compile(r"(^|/)(optim|scheduler|tests?)/")


def migrate(path: Path, rules: list[str]) -> dict[str, dict[int, tuple[str, str]]]:
    """Per rule, its findings about sites in `path` by line: (status, message)."""
    from npu_migrate.engine.pipeline import migrate_text

    text = path.read_text(encoding="utf-8", errors="replace")
    _, findings = migrate_text(text, path=str(path), select=rules)
    found: dict[str, dict[int, tuple[str, str]]] = {rule: {} for rule in rules}
    for f in findings:
        if f.rule_id not in found or _NOT_A_SITE.match(f.message):
            continue
        rule = NATIVE if f.message.startswith(f"{_SDPA} left as it is") else f.rule_id
        found.setdefault(rule, {}).setdefault(f.line, ("fused" if f.fixed else "declined", f.message))
    return found


def measure(
    packages: list[str], rules: list[str] | None = None, cache: Path = CACHE, discover: bool = False
) -> dict[str, dict[str, dict]]:
    """Per rule, per package: its known sites with their status and reason (and the look-alikes)."""
    rules = rules or list(RULES)
    wanted_by: dict[tuple[str, str], dict[str, Site]] = {}
    for site in known_sites():
        if site.rule in rules and site.package in packages:
            wanted_by.setdefault((site.package, site.file), {})[f"{site.rule} {site.function}"] = site
    report: dict[str, dict[str, dict]] = {rule: {} for rule in rules}
    for package in packages:
        root = fetch(package, cache)
        rows: list[dict] = []
        files = sorted({f for p, f in wanted_by if p == package})
        if discover:
            found = (str(p.relative_to(root)) for p in root.rglob("*.py"))
            files = sorted({*files, *(f for f in found if not _NOT_MODEL_CODE.search(f))})
        for name in files:
            text = (root / name).read_text(encoding="utf-8", errors="replace")
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            functions = rotary_recall._functions(tree)
            wanted = wanted_by.get((package, name), {})
            extra = []
            if discover:
                for qualified, node in functions.items():
                    segment = ast.get_source_segment(text, node) or ""
                    for rule in rules:
                        # a constructor builds modules (an `nn.SiLU()`), it computes none of these but NPU706's
                        computes = rule == "NPU706" or not qualified.endswith("__init__")
                        if computes and f"{rule} {qualified}" not in wanted and _LOOKS[rule](segment):
                            extra.append((rule, qualified))
            if not wanted and not extra:
                continue
            findings = migrate(root / name, rules)
            for site in wanted.values():
                node = functions.get(site.function)
                got = ("missing", "no such function") if node is None else _status(findings, site.rule, node)
                rows.append(_row(site.rule, name, site.function, got, site.expected))
            for rule, qualified in extra:
                rows.append(_row(rule, name, qualified, _status(findings, rule, functions[qualified]), ""))
        for rule in rules:
            mine = [r for r in rows if r["rule"] == rule]
            known = [r for r in mine if r["expected"]]
            if not mine:
                continue
            report[rule][package] = {
                "version": PACKAGES[package],
                "known": len(known),
                **{s: sum(r["status"] == s for r in known) for s in STATUSES},
                "rows": mine,
            }
    return report


def _status(found: dict[str, dict[int, tuple[str, str]]], rule: str, node: ast.FunctionDef) -> tuple[str, str]:
    """The site's first finding inside the function, nested functions excluded (they are sites of their own).

    Hand-written attention beside an SDPA call (`if self.fused_attn: sdpa(...) else: <by hand>`) is no site
    of NPU704's: the call is, left to torch_npu's native fused dispatch and reported once per file, so such
    a function is "native" where the file got that report."""
    findings = found[rule]
    nested = [
        range(n.lineno, (n.end_lineno or n.lineno) + 1)
        for n in ast.walk(node)
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        if line in findings and not any(line in r for r in nested):
            return findings[line]
    if rule == "NPU704" and NATIVE in found and _calls_sdpa(node):
        return "native", found[NATIVE][min(found[NATIVE])][1]
    return "silent", ""


def _calls_sdpa(node: ast.FunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", "")) == _SDPA
        for n in ast.walk(node)
    )


def _row(rule: str, file: str, function: str, got: tuple[str, str], expected: str) -> dict:
    return {"rule": rule, "file": file, "function": function, "status": got[0], "expected": expected, "why": got[1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help=f"PyPI names (default: all of {', '.join(PACKAGES)})")
    parser.add_argument("--rule", action="append", choices=list(RULES), help="measure only these (repeatable)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the downloads are unpacked")
    parser.add_argument("--discover", action="store_true", help="also list look-alikes outside the known sites")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    packages = args.packages or list(PACKAGES)
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown:
        parser.error(f"not pinned here: {', '.join(unknown)}")
    report = measure(packages, args.rule, args.cache, args.discover)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for rule, by_package in report.items():
        total = dict.fromkeys(("known", *STATUSES), 0)
        print(f"{rule} ({RULES[rule]})")
        for package, entry in by_package.items():
            for key in total:
                total[key] += entry[key]
            counts = ", ".join(f"{entry[s]} {s}" for s in STATUSES)
            print(f"  {package}=={entry['version']}: {entry['known']} known, {counts}")
            for row in entry["rows"]:
                mark = "" if row["expected"] else "  [not in the list]"
                why = f": {row['why'][:160]}" if row["status"] in ("declined", "native") else ""
                print(f"    {row['status']:8} {row['file']}::{row['function']}{mark}{why}")
        counts = ", ".join(f"{total[s]} {s}" for s in STATUSES)
        print(f"  {rule} total: {total['known']} known, {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
