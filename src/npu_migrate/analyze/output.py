"""The analysis report in every format: terminal summary, CSVs, report.json, SARIF, markdown, HTML.

Findings are the engine's `Finding`s whatever produced them, so the text lines, the SARIF results and
the GitHub-style locations are those of `apply` (`report.format_finding`, `report.sarif_document`).
Markdown and HTML are jinja2 templates under `templates/report/`; the HTML is one self-contained file
(inline CSS, charts drawn with CSS, no script, no network), so it can be mailed or archived as is and read
top-down: the rating and the charts first, then what to do rule by rule, then the details.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections import Counter
from pathlib import Path

from npu_migrate import __version__
from npu_migrate.analyze.project import Analysis, Table
from npu_migrate.engine.registry import all_rules as documented_rules
from npu_migrate.engine.registry import family_of as category
from npu_migrate.findings import Finding
from npu_migrate.output.report import format_finding, sarif_document

JSON_SCHEMA_VERSION = 1
#: Rows of one table shown in the markdown and HTML reports; the CSV and report.json have them all.
REPORT_ROWS = 500


def summary_lines(analysis: Analysis) -> list[str]:
    findings = analysis.findings
    severities = Counter(f.severity.value for f in findings if not f.fixed)
    fixed = sum(1 for f in findings if f.fixed)
    scanned = len(analysis.files)
    lines = [
        f"npu-migrate analyze: {scanned} files under {analysis.root} (torch_npu {analysis.torch_npu_version}; "
        f"modes: {', '.join(analysis.settings.modes)})",
        f"{len(findings)} findings: {severities['error']} errors, {severities['warning']} warnings, "
        f"{severities['info']} info, {fixed} that `npu-migrate apply` rewrites",
    ]
    for result in analysis.results:
        lines.extend(f"  {result.mode}: {line}" for line in result.summary)
    if analysis.errors:
        lines.append(f"{len(analysis.errors)} files could not be analysed (see above)")
    return lines


#: The columns of a table that hold root-relative locations (`path:line:col`); `locations` lists several,
#: space-separated, maybe ending in "...".
_LOCATION_COLUMNS = ("location", "first_location", "locations")
_LOCATION = re.compile(r"(?P<path>.+?)(?P<position>(:\d+)*)")


def write_csv(path: Path, table: Table) -> None:
    """`table` as CSV (`shown_tables` gives its locations as `apply` shows them)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(table.header)
        writer.writerows(table.rows)


def _relocated(cell: str, shown) -> str:
    def one(location: str) -> str:
        parts = _LOCATION.fullmatch(location)
        return location if parts is None else shown(parts["path"]) + parts["position"]

    return " ".join(one(word) for word in cell.split(" "))


def as_shown(analysis: Analysis) -> list[Finding]:
    """The findings with the paths `apply` shows for the same files from the current folder."""
    return [dataclasses.replace(f, path=analysis.shown(f.path)) for f in analysis.findings]


def findings_csv(findings: list[Finding]) -> str:
    handle = io.StringIO()
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(["location", "rule", "severity", "category", "fixed", "message"])
    for f in findings:
        writer.writerow([f.location(), f.rule_id, f.severity.value, category(f.rule_id), f.fixed, f.message])
    return handle.getvalue()


def json_document(analysis: Analysis) -> dict:
    findings = analysis.findings
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": {"name": "npu-migrate", "version": __version__},
        "command": "analyze",
        "root": str(analysis.root),
        "torch_npu_version": analysis.torch_npu_version,
        "modes": list(analysis.settings.modes),
        "summary": {
            "files_scanned": len(analysis.files),
            "files_failed": len(analysis.errors),
            "findings": len(findings),
            "by_rule": dict(sorted(Counter(f.rule_id for f in findings).items())),
            "by_category": dict(sorted(Counter(category(f.rule_id) for f in findings).items())),
        },
        "findings": [{**f.to_dict(), "location": f.location(), "category": category(f.rule_id)} for f in findings],
        "results": {
            r.mode: {
                "title": r.title,
                "summary": r.summary,
                "data": r.data,
                "tables": {t.name: {"title": t.title, "header": t.header, "rows": t.rows} for t in r.tables},
            }
            for r in analysis.results
        },
        "errors": [{"path": p, "error": e} for p, e in analysis.errors],
    }


def sarif(analysis: Analysis) -> dict:
    """SARIF 2.1.0: the engine's document (its rules are the registry's, NPU9xx included), paths from the root."""
    # Not the paths `apply` shows from the current folder: SARIF's own convention is a URI relative to a
    # named base (`uriBaseId`, declared in `originalUriBaseIds`), which viewers and GitHub code scanning
    # resolve; a cwd-relative path would mean nothing to a reader opening the file elsewhere.
    document = sarif_document(analysis.findings)
    run = document["runs"][0]
    base = analysis.root.as_uri() + "/"
    run["originalUriBaseIds"] = {"SRCROOT": {"uri": base}}
    for result in run["results"]:
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] = "SRCROOT"
    return document


#: Severity order of the "what to do" list: what breaks on NPU first.
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
#: Bars of the by-file chart: enough to see where the work is, few enough for the top of the page.
CHART_FILES = 10


def _rule_groups(findings: list[Finding]) -> list[dict]:
    """Findings by rule, what a person must do first (errors, then warnings, then info; larger groups
    first), then the rules whose every site `npu-migrate apply` rewrites."""
    rules = {rule.id: rule for rule in documented_rules()}
    grouped: dict[str, list[Finding]] = {}
    for f in findings:
        grouped.setdefault(f.rule_id, []).append(f)
    groups = []
    for rule_id, members in grouped.items():
        manual = [f for f in members if not f.fixed]
        rule = rules.get(rule_id)
        groups.append(
            {
                "id": rule_id,
                "rule": rule,
                "severity": (manual or members)[0].severity.value,
                "manual": len(manual),
                "automatic": len(members) - len(manual),
                "findings": sorted(members, key=lambda f: f.fixed),  # what needs a person first
            }
        )
    return sorted(
        groups,
        key=lambda g: (not g["manual"], _SEVERITY_ORDER.get(g["severity"], 3), -g["manual"], -g["automatic"], g["id"]),
    )


def _bars(counts: dict[str, list[int]], limit: int | None = None) -> list[dict]:
    """Rows of a bar chart: label, findings a person must handle and those apply rewrites, bar widths in
    per cent of the largest total (drawn by CSS: the page needs no JavaScript)."""
    rows = sorted(counts.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:limit]
    top = max((sum(v) for _, v in rows), default=1) or 1
    return [
        {
            "label": label,
            "manual": manual,
            "automatic": automatic,
            "manual_width": round(100 * manual / top, 1),
            "automatic_width": round(100 * automatic / top, 1),
        }
        for label, (manual, automatic) in rows
    ]


def _chart_counts(findings: list[Finding], key) -> dict[str, list[int]]:
    counts: dict[str, list[int]] = {}
    for f in findings:
        counts.setdefault(key(f), [0, 0])[f.fixed] += 1
    return counts


def shown_tables(analysis: Analysis, result) -> list[Table]:
    """The tables of `result` with their location columns' paths as `apply` shows them (`Analysis.shown`):
    what the CSVs write and the markdown and HTML reports show. A cell naming no file of the tree (a
    module name, a dependency) stays as it is."""

    def shown(where: str) -> str:
        return analysis.shown(where) if (analysis.root / where).is_file() else where

    at = set(_LOCATION_COLUMNS)
    return [
        dataclasses.replace(
            table,
            rows=[
                [
                    _relocated(cell, shown) if table.header[i] in at and isinstance(cell, str) else cell
                    for i, cell in enumerate(row)
                ]
                for row in table.rows
            ],
        )
        if at.intersection(table.header)
        else table
        for table in result.tables
    ]


def _context(analysis: Analysis) -> dict:
    # The paths people read (markdown, HTML) are those of the text report and of `apply` for the same
    # files, so a location can be pasted into either; report.json names the root and keeps paths relative
    # to it, and SARIF resolves them against its SRCROOT base (`sarif`).
    findings = as_shown(analysis)
    results = [dataclasses.replace(r, tables=shown_tables(analysis, r)) for r in analysis.results]
    complexity = next((r.data.get("complexity") for r in analysis.results if r.mode == "model"), None)
    cited = {f.rule_id for f in findings}
    return {
        "analysis": analysis,
        "version": __version__,
        "summary": summary_lines(analysis),
        "findings": findings,
        "category": category,
        "results": results,
        "rules": documented_rules(),
        "cited": cited,
        "groups": _rule_groups(findings),
        "complexity": complexity,
        "limit": REPORT_ROWS,
        "severity_counts": Counter("fixed" if f.fixed else f.severity.value for f in findings),
        "chart": {
            "by_category": _bars(_chart_counts(findings, lambda f: category(f.rule_id))),
            "by_file": _bars(_chart_counts(findings, lambda f: f.path), CHART_FILES),
            "files": len({f.path for f in findings}),
        },
    }


def markdown(analysis: Analysis) -> str:
    from npu_migrate.engine.templating import environment

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    env = environment().overlay()
    env.filters["cell"] = cell
    return env.get_template("report/report.md.j2").render(**_context(analysis))


def code_spans(text) -> str:
    """Text for the HTML report: escaped, and the `backticked` code of messages and summaries set as
    <code>, as the Markdown report shows it (raw backticks read as noise in a browser)."""
    import re

    from markupsafe import Markup, escape

    return Markup(re.sub(r"`([^`\n]+)`", r"<code>\1</code>", str(escape(text))))


def html(analysis: Analysis) -> str:
    from npu_migrate.engine.templating import environment

    env = environment().overlay(autoescape=True)
    env.filters["code"] = code_spans
    env.filters["acted_on"] = lambda table: [r for r in table.rows if table.routine is None or not table.routine(r)]
    return env.get_template("report/report.html.j2").render(**_context(analysis))


def write_reports(analysis: Analysis, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for result in analysis.results:
        for table in shown_tables(analysis, result):
            path = out / table.name
            write_csv(path, table)
            written.append(path)
    for name, text in (
        ("report.json", json.dumps(json_document(analysis), indent=2) + "\n"),
        ("report.sarif", json.dumps(sarif(analysis), indent=2) + "\n"),
        ("report.md", markdown(analysis)),
        ("report.html", html(analysis)),
    ):
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def render(analysis: Analysis, fmt: str) -> str:
    """The report in one format, for stdout."""
    if fmt == "json":
        return json.dumps(json_document(analysis), indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(sarif(analysis), indent=2) + "\n"
    if fmt == "markdown":
        return markdown(analysis)
    if fmt == "html":
        return html(analysis)
    if fmt == "csv":
        return findings_csv(as_shown(analysis))
    lines = [format_finding(f, written=False) for f in as_shown(analysis)]
    return "\n".join(lines) + ("\n" if lines else "")
