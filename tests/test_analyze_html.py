"""The HTML report opened in headless Chromium: the summary, its rating and charts fill the first screen
(1280x800) without a script, the findings are grouped by rule, the tables render.

Needs Debian's chromium (`apt-get install -y chromium`); a missing browser fails the test with that
instruction rather than skipping it, so CI cannot pass without having looked at the page.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from test_analyze import LIBRARY, PROJECT, SHOWN_FROM_ROOT, run_analyze

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium is needed to check the HTML report: apt-get update && apt-get install -y chromium")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    result = run_analyze(PROJECT, "--mode", "all", "--env-path", LIBRARY, "--output", out)
    assert result.returncode == 0, result.stderr
    return out / "report.html"


def browse(report: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *extra, report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_dom_has_the_summary_charts_and_findings_grouped_by_rule(report, tmp_path):
    result = browse(report, tmp_path, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "<script" not in dom  # readable without JavaScript: nothing is drawn by a script
    category = re.search(r'<div class="chart" id="chart-category">.*?</div>\n</div>', dom, re.S).group(0)
    by_file = re.search(r'<div class="chart" id="chart-file">.*?</div>\n</div>', dom, re.S).group(0)
    category_bars = re.findall(r'<div class="row" data-label="([^"]+)" data-value="(\d+)"', category)
    file_bars = re.findall(r'<div class="row" data-label="([^"]+)" data-value="(\d+)"', by_file)
    assert {"custom_kernels", "dynamic_shape", "third_party", "model"} <= {label for label, _ in category_bars}
    # Named as `apply` and the text report name them from the folder analyze ran in (the repository root).
    assert (SHOWN_FROM_ROOT + "kernels/bias_act_kernel.cu", "2") in file_bars
    total = int(re.search(r'<b id="count-findings">(\d+)</b>', dom).group(1))
    assert sum(int(v) for _, v in category_bars) == total
    todo = re.search(r'<section id="todo">.*?</section>', dom, re.S).group(0)
    groups = re.findall(r'<details class="rule" id="rule-(NPU\d+)">', todo)
    assert len(groups) == len(set(groups)) and "NPU902" in groups
    assert len(re.findall(r'<td class="loc">', todo)) == total  # every finding under its rule, once
    assert '<span class="badge rating-Medium" id="rating">Medium</span>' in dom
    assert "rendered" not in dom and "npu_migrate.analyze" not in dom  # no debug line, no internal names
    contents = re.search(r'<nav id="contents".*?</nav>', dom, re.S).group(0)
    for anchor in re.findall(r'href="#([\w-]+)"', contents):
        assert f'id="{anchor}"' in dom


def test_the_every_api_table_shows_only_what_is_not_one_to_one(report):
    text = report.read_text(encoding="utf-8")
    table = re.search(r'<table data-name="torch_api_list.csv">.*?</table>', text, re.S).group(0)
    apis = re.findall(r"<tr><td>([\w.]+)</td><td>(\w+)</td>", table)
    assert ("torch.cuda.get_device_properties", "unsupported") in apis
    assert not any(api == "torch.nn.functional.silu" for api, _ in apis)  # runs as it is: folded away
    assert re.search(r"\d+ more run on the NPU as they are: listed in torch_api_list.csv", text)


def _bounding_boxes(report: Path, tmp_path: Path, ids: list[str]) -> dict[str, dict]:
    """Where the elements `ids` lie in a 1280x800 window, as laid out by Chromium: a copy of the page
    with a script that writes their boxes into the DOM, which --dump-dom prints."""
    probe = tmp_path / "probe.html"
    script = (
        "<script>document.body.setAttribute('data-boxes', JSON.stringify(Object.fromEntries("
        f"{ids!r}.map(id => [id, document.getElementById(id).getBoundingClientRect()]))));</script>"
    )
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    result = browse(probe, tmp_path, "--window-size=1280,800", "--virtual-time-budget=2000", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    boxes = re.search(r'data-boxes="([^"]+)"', result.stdout).group(1)
    return json.loads(html.unescape(boxes))


def test_the_summary_is_visible_without_scrolling(report, tmp_path):
    boxes = _bounding_boxes(report, tmp_path, ["summary", "rating", "chart-category", "chart-file", "contents"])
    for name, box in boxes.items():
        assert box["top"] >= 0 and box["bottom"] <= 800, f"{name} is not in the first 1280x800 screen: {box}"
        assert box["right"] <= 1280, f"{name} is wider than the window: {box}"


def _png_pixels(data: bytes) -> tuple[int, int, set]:
    """Width, height and the distinct colours of a (non-interlaced, 8-bit RGB/RGBA) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    idat = b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IDAT":
            idat += body
        else:
            chunks[kind] = body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    colours, previous = set(), bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        if y % 4 == 0:
            colours.update(bytes(line[i : i + 3]) for i in range(0, stride, channels * 4))
        previous = line
    return width, height, colours


def test_screenshot_of_the_top_of_the_page_shows_the_rating_and_the_charts(report, tmp_path):
    shot = tmp_path / "report.png"
    result = browse(report, tmp_path, "--window-size=1280,800", f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    width, height, colours = _png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 800)
    assert bytes((0x1F, 0x3B, 0x57)) in colours  # the header band
    assert bytes((0xB5, 0x47, 0x08)) in colours  # the Medium rating badge
    assert bytes((0x3B, 0x82, 0xC4)) in colours  # bars: findings that need a person
    assert bytes((0x5F, 0xB3, 0x8A)) in colours  # bars: sites apply rewrites
