"""The HTML report opened in headless Chromium: its JavaScript draws the charts, the tables render.

Needs Debian's chromium (`apt-get install -y chromium`); a missing browser fails the test with that
instruction rather than skipping it, so CI cannot pass without having looked at the page.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from test_analyze import LIBRARY, PROJECT, run_analyze

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


def test_dom_after_javascript_has_the_charts_and_tables(report, tmp_path):
    result = browse(report, tmp_path, "--virtual-time-budget=5000", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    category = re.search(r'<svg id="chart-category".*?</svg>', dom, re.S).group(0)
    by_file = re.search(r'<svg id="chart-file".*?</svg>', dom, re.S).group(0)
    category_bars = re.findall(r'<rect class="bar"[^>]*data-label="([^"]+)" data-value="(\d+)"', category)
    file_bars = re.findall(r'<rect class="bar"[^>]*data-label="([^"]+)" data-value="(\d+)"', by_file)
    assert {"custom_kernels", "dynamic_shape", "third_party", "model"} <= {label for label, _ in category_bars}
    assert ("kernels/bias_act_kernel.cu", "2") in file_bars
    total = int(re.search(r'<b id="count-findings">(\d+)</b>', dom).group(1))
    assert sum(int(v) for _, v in category_bars) == total
    assert f"rendered {len(category_bars) + len(file_bars)} bars" in dom
    assert len(re.findall(r"<tr><td class=\"loc\">", dom)) >= total  # every finding has its row
    assert '<span class="badge rating-High" id="rating">High</span>' in dom


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


def test_screenshot_is_not_blank(report, tmp_path):
    shot = tmp_path / "report.png"
    result = browse(report, tmp_path, "--virtual-time-budget=5000", "--window-size=1280,1600", f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    width, height, colours = _png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 1600)
    assert bytes((0x1F, 0x3B, 0x57)) in colours  # the header band
    assert bytes((0x3B, 0x82, 0xC4)) in colours  # chart bars, drawn by the page's JavaScript
    assert len(colours) > 20
