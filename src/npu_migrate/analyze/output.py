"""The analysis report in every format: terminal summary, CSVs, report.json, SARIF, markdown, HTML.

Findings are the engine's `Finding`s whatever produced them, so the text lines, the SARIF results and
the GitHub-style locations are those of `apply` (`report.format_finding`, `report.sarif_document`).
Markdown and HTML are jinja2 templates under `templates/report/`; the HTML is one self-contained file
(inline CSS, inline JS drawing the charts as SVG, no network), so it can be mailed or archived as is.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

from npu_migrate import __version__
from npu_migrate.analyze.project import Analysis, Table
from npu_migrate.findings import Finding
from npu_migrate.registry import all_rules as documented_rules
from npu_migrate.registry import family_of as category
from npu_migrate.report import format_finding, sarif_document

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


def write_csv(path: Path, table: Table) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(table.header)
        writer.writerows(table.rows)


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
    document = sarif_document(analysis.findings)
    run = document["runs"][0]
    base = analysis.root.as_uri() + "/"
    run["originalUriBaseIds"] = {"SRCROOT": {"uri": base}}
    for result in run["results"]:
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] = "SRCROOT"
    return document


def _context(analysis: Analysis) -> dict:
    findings = analysis.findings
    by_category = Counter(category(f.rule_id) for f in findings)
    by_file = Counter(f.path for f in findings)
    complexity = next((r.data.get("complexity") for r in analysis.results if r.mode == "model"), None)
    cited = {f.rule_id for f in findings}
    return {
        "analysis": analysis,
        "version": __version__,
        "summary": summary_lines(analysis),
        "findings": findings,
        "category": category,
        "results": analysis.results,
        "rules": documented_rules(),
        "cited": cited,
        "complexity": complexity,
        "limit": REPORT_ROWS,
        "severity_counts": Counter("fixed" if f.fixed else f.severity.value for f in findings),
        "chart": {
            "by_category": sorted(by_category.items(), key=lambda kv: (-kv[1], kv[0])),
            "by_file": sorted(by_file.items(), key=lambda kv: (-kv[1], kv[0]))[:20],
        },
    }


def markdown(analysis: Analysis) -> str:
    from npu_migrate.templating import environment

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    env = environment().overlay()
    env.filters["cell"] = cell
    return env.get_template("report/report.md.j2").render(**_context(analysis))


def html(analysis: Analysis) -> str:
    from markupsafe import Markup

    from npu_migrate.templating import environment

    env = environment().overlay(autoescape=True)
    context = _context(analysis)
    data = json.dumps(context["chart"]).replace("<", "\\u003c")
    return env.get_template("report/report.html.j2").render(**context, chart_json=Markup(data))


def write_reports(analysis: Analysis, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for result in analysis.results:
        for table in result.tables:
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
        return findings_csv(analysis.findings)
    lines = [format_finding(f, written=False) for f in analysis.findings]
    return "\n".join(lines) + ("\n" if lines else "")
