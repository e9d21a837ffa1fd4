"""The HTML report in a real headless Chromium (Debian's package; `.ci/run`
installs it): it loads with no console errors and no network request, its
charts are drawn (the DOM and a screenshot's pixels), and the interactions
work: zooming the timeline, switching the flamegraph to modules, sorting."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest

import allocscope
from allocscope import EventKind
from tests.support.training_run import training_run
from allocscope.reports.html import write_html

from ..browser import Chromium, find_chromium

pytestmark = [pytest.mark.torch_agnostic, pytest.mark.browser]


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        why = "no Chromium installed (Debian package `chromium`; make test installs it)"
        if os.environ.get("CI") == "true":  # CI must run them: a missing browser fails the run
            pytest.fail(why)
        pytest.skip(why)
    b = Chromium(exe)
    yield b
    b.close()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    cap_path = str(d / "run.alsc")
    training_run(cap_path, 30_000, device="cuda", layers=6, hidden=512, batch=256)
    html_path = str(d / "run.html")
    write_html(allocscope.load(cap_path), html_path, progress=False)
    return html_path


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB(A) rows of an 8-bit PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line[j] for k in range(0, stride, bpp) for j in range(k, k + 3)))
        prev = line
    return width, height, rows


def element_pixels(b: Chromium, selector: str, tmp_path) -> tuple[int, set[bytes]]:
    """(non-white pixels, distinct colours) of an element's screenshot."""
    r = b.evaluate(f"(() => {{ const r = document.querySelector('{selector}').getBoundingClientRect();"
                   " return [r.x + window.scrollX, r.y + window.scrollY, r.width, r.height]; })()")
    import base64
    shot = b.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                             "clip": {"x": r[0], "y": r[1], "width": r[2], "height": r[3], "scale": 1}},
                  session=True)
    _, _, rows = decode_png(base64.b64decode(shot["data"]))
    pixels = [row[i:i + 3] for row in rows for i in range(0, len(row), 3)]
    return sum(p != b"\xff\xff\xff" for p in pixels), set(pixels)


def test_report_opens_offline_with_no_errors_and_draws_every_chart(browser, page, tmp_path):
    browser.open(page)  # raises if the page never finishes drawing
    assert browser.console_errors() == []
    assert [u for u in browser.requests() if not u.startswith("file://")] == []
    data = browser.evaluate("JSON.stringify(['timeline', 'waterfall', 'flame', 'segments']"
                            ".map((id) => Number(document.getElementById(id).dataset.drawn)))")
    timeline, waterfall, flame, segments = __import__("json").loads(data)
    assert timeline >= 5  # parameter, gradient, optimizer state, activation, input, temporary...
    assert waterfall >= 3 and flame >= 10 and segments >= 10
    assert browser.evaluate("document.querySelectorAll('#sites tbody tr').length") >= 3
    non_white, colours = element_pixels(browser, "#timeline", tmp_path)
    assert non_white > 5000 and len(colours) > 20  # stacked areas, not an empty frame
    browser.screenshot(str(tmp_path / "report.png"))


def test_timeline_zooms_on_drag_and_resets(browser, page):
    browser.open(page)
    full = browser.evaluate("document.getElementById('timeline').dataset.range")
    r = browser.evaluate("(() => { const r = document.querySelector('#timeline .overlay').getBoundingClientRect();"
                         " return [r.x, r.y, r.width, r.height]; })()")
    browser.drag(r[0] + 0.3 * r[2], r[1] + r[3] / 2, r[0] + 0.5 * r[2])
    zoomed = browser.evaluate("document.getElementById('timeline').dataset.range")
    a0, a1 = map(float, full.split(","))
    b0, b1 = map(float, zoomed.split(","))
    assert a0 < b0 < b1 < a1
    assert abs((b1 - b0) - 0.2 * (a1 - a0)) < 0.02 * (a1 - a0)
    browser.click("#zoom-reset")
    assert browser.evaluate("document.getElementById('timeline').dataset.range") == full
    assert browser.console_errors() == []


def test_flamegraph_switches_to_the_module_view(browser, page):
    browser.open(page)
    stack_names = browser.evaluate("Array.from(document.querySelectorAll('#flame title')).map((t) => t.textContent).join('|')")
    assert "train.py" in stack_names
    browser.click("#flame-toolbar button[data-view=module]")
    assert browser.evaluate("document.getElementById('flame').dataset.view") == "module"
    names = browser.evaluate("Array.from(document.querySelectorAll('#flame title')).map((t) => t.textContent).join('|')")
    assert "layers" in names and "train.py" not in names
    # Clicking a node zooms into it: fewer, wider nodes.
    before = int(browser.evaluate("document.getElementById('flame').dataset.drawn"))
    browser.click("#flame g.node:nth-of-type(2)")
    assert int(browser.evaluate("document.getElementById('flame').dataset.drawn")) < before
    browser.click("#timeline-toolbar button[data-mode=module]")
    legend = browser.evaluate("document.getElementById('timeline-legend').textContent")
    assert "layers.0" in legend
    assert browser.console_errors() == []


def test_tables_sort_by_a_clicked_column(browser, page):
    browser.open(page)
    browser.click("#sites th:nth-child(3)")  # count, descending first
    assert browser.evaluate("document.getElementById('sites').dataset.sort") == "allocations:desc"
    counts = browser.evaluate("Array.from(document.querySelectorAll('#sites tbody tr td:nth-child(3)'))"
                              ".map((td) => Number(td.textContent))")
    assert counts == sorted(counts, reverse=True) and len(counts) >= 3
    browser.click("#sites th:nth-child(3)")
    counts = browser.evaluate("Array.from(document.querySelectorAll('#sites tbody tr td:nth-child(3)'))"
                              ".map((td) => Number(td.textContent))")
    assert counts == sorted(counts)


def test_a_hostile_string_in_the_capture_stays_text(browser, tmp_path):
    from allocscope.capture.format import EventKind
    from allocscope.capture.writer import CaptureWriter

    b = CaptureWriter()
    evil = '</script><script>document.title="pwned"</script><img src=x onerror=alert(1)>'
    s = b.stack([(evil + ".py", evil, 1)])
    b.annotate(EventKind.PHASE, "forward", addr=0)
    b.alloc(0x1000, 4096, stack=s)
    b.mark(evil)
    path = str(tmp_path / "evil.html")
    write_html(allocscope.load(b.write(tmp_path / "evil.alsc")), path, progress=False)
    browser.open(path)
    assert browser.evaluate("document.title") != "pwned"
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert browser.console_errors() == []
    assert [u for u in browser.requests() if not u.startswith("file://")] == []


def test_library_frames_are_folded_until_asked_for(browser, tmp_path):
    from allocscope.capture.writer import CaptureWriter

    b = CaptureWriter()
    torch_py = "/venv/lib/python3.11/site-packages/torch/nn/modules/"
    stack = b.stack([(torch_py + "linear.py", "Linear.forward", 134), (torch_py + "module.py", "Module._call_impl", 1794),
                     (torch_py + "module.py", "Module._wrapped_call_impl", 1783), ("train.py", "main", 10)])
    for i in range(8):
        b.alloc(0x1000 * (i + 1), 4096, stack=stack)
    path = str(tmp_path / "lib.html")
    write_html(allocscope.load(b.write(tmp_path / "lib.alsc")), path, progress=False)
    browser.open(path)
    titles = "Array.from(document.querySelectorAll('#flame title')).map((t) => t.textContent).join('|')"
    folded = browser.evaluate(titles)
    assert "Linear.forward [+2 library frames]" in folded and "Module._wrapped_call_impl (" not in folded
    browser.click("#flame-library")
    assert browser.evaluate("document.getElementById('flame').dataset.library") == "true"
    shown = browser.evaluate(titles)
    assert "Module._wrapped_call_impl (" in shown and "library frames]" not in shown
    browser.click("#flame-toolbar button[data-view=module]")  # the toggle is for stacks only
    assert browser.evaluate("getComputedStyle(document.getElementById('flame-library')).display") == "none"
    assert browser.console_errors() == []


def test_the_timeline_axis_switches_between_time_and_events(browser, page):
    browser.open(page)
    tl = "document.getElementById('timeline').dataset"
    assert browser.evaluate(f"{tl}.axis") == "time"
    browser.click("#timeline-toolbar button[data-axis=event]")
    assert browser.evaluate(f"{tl}.axis") == "event"
    x0, x1 = (float(v) for v in browser.evaluate(f"{tl}.range").split(","))
    assert x0 >= -1 and x1 > x0 and x1 < 10_000_000  # event numbers, not nanoseconds
    browser.click("#timeline-toolbar button[data-axis=time]")
    assert browser.evaluate(f"{tl}.axis") == "time"
    assert browser.console_errors() == []


def test_a_virtual_card_s_page_opens_on_events_where_memory_moves(browser, tmp_path):
    """What a newcomer sees first on a capture made on the virtual GPU: the
    header says the card was virtual and that times are not the card's; the
    timeline's axis is events, starting where memory first moves (not at the
    set-up before it), and its areas fill the chart's width."""
    cap_path = str(tmp_path / "virtual.alsc")
    training_run(cap_path, 20_000, device="cuda", layers=8, hidden=1024, batch=256, set_up=5_000,
                 metadata={"virtual_gpu": {"spec": "H100-80GB", "devices": []}})
    cap = allocscope.load(cap_path)
    first_alloc = int(np.flatnonzero(cap.events.kind == EventKind.ALLOC)[0])
    assert first_alloc > 0.2 * len(cap.events)  # a fifth of the events allocate nothing
    path = str(tmp_path / "virtual.html")
    write_html(cap, path, progress=False)
    browser.open(path)
    assert browser.console_errors() == []
    note = browser.evaluate("document.getElementById('virtual-note').textContent")
    assert "virtual H100-80GB" in note and "times are" in note
    tl = "document.getElementById('timeline').dataset"
    assert browser.evaluate(f"{tl}.axis") == "event"
    assert browser.evaluate("document.querySelector('#timeline-toolbar button.on[data-axis]').dataset.axis") == "event"
    x0, x1 = (float(v) for v in browser.evaluate(f"{tl}.range").split(","))
    bucket = len(cap.events) / 2000  # the timeline's points: each the peak of a slice of the events
    assert first_alloc - 2 * bucket <= x0 < first_alloc and x1 >= len(cap.events) - 2 * bucket
    # as a person sees it: coloured areas in (nearly) every column of the plot
    r = browser.evaluate("(() => { const r = document.querySelector('#timeline .overlay').getBoundingClientRect();"
                         " return [r.x + window.scrollX, r.y + window.scrollY, r.width, r.height]; })()")
    import base64

    shot = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                   "clip": {"x": r[0], "y": r[1], "width": r[2], "height": r[3],
                                                            "scale": 1}}, session=True)
    width, height, rows = decode_png(base64.b64decode(shot["data"]))
    background = {b"\xff\xff\xff", b"\xee\xf0\xf3"}  # the page, the grid lines
    filled = sum(sum(row[3 * x:3 * x + 3] not in background for row in rows) >= height // 20 for x in range(width))
    assert filled >= 0.9 * width, (filled, width)
    # the same capture without the virtual GPU's metadata opens on time
    plain = tmp_path / "plain.alsc"
    training_run(str(plain), 20_000, device="cuda", layers=8, hidden=1024, batch=256, set_up=5_000)
    write_html(allocscope.load(plain), str(tmp_path / "plain.html"), progress=False)
    browser.open(str(tmp_path / "plain.html"))
    assert browser.evaluate(f"{tl}.axis") == "time"
    assert browser.evaluate("document.getElementById('virtual-note')") is None


def test_a_search_s_capture_plots_memory_against_the_value(browser, tmp_path):
    """The page of one of fit --search's captures: the card's verdict, then
    its memory against the value from the search's document beside it
    (fit.json): the parts stacked, the runs as points, the size class."""
    import json

    from allocscope.reports.fit import FIT_DOCUMENT, search_document
    from allocscope.reports.scaling import memory_model

    MiB = 1 << 20

    def card(v):
        return {"verdict": "fits", "peak_allocated_bytes": 300 * MiB + v * MiB, "peak_reserved_bytes": 320 * MiB + v * MiB,
                "outside_allocator_bytes": 512 * MiB, "largest_growing_request_bytes": v * 256 * 1024,
                "peak": {"by_category": {"parameter": 100 * MiB, "gradient": 100 * MiB, "optimizer_state": 100 * MiB,
                                         "activation": v * MiB}}}

    model = memory_model("B", [(v, card(v)) for v in (16, 32, 64)], 1, 64)
    doc = search_document(["python", "train.py", "{B}"], "B", 1, 64,
                          [{"gpu": "H100-80GB", "largest": 64, "runs": 3, "tried": [32, 64, 16], "memory": model}])
    (tmp_path / FIT_DOCUMENT).write_text(json.dumps(doc))
    cap_path = str(tmp_path / "H100-80GB.B=64.alsc")
    training_run(cap_path, 5_000, device="cuda", layers=4, hidden=256, batch=64,
                 metadata={"fit": {"gpu": "H100-80GB", "search": "B", "value": 64, "command": ["python", "train.py"]}})
    path = str(tmp_path / "search.html")
    write_html(allocscope.load(cap_path), path, progress=False)
    browser.open(path)
    assert browser.console_errors() == []
    assert browser.evaluate("getComputedStyle(document.getElementById('fit-memory-section')).display") != "none"
    title = browser.evaluate("document.getElementById('fit-memory-title').textContent")
    assert "832.00 MiB + 1.00 MiB per B" in title and "proportional" in title  # 300 + 20 cached + 512
    plot = "document.getElementById('fit-memory')"
    assert browser.evaluate(f"{plot}.dataset.points") == "3"
    assert int(browser.evaluate(f"{plot}.dataset.drawn")) == len(model["parts"]) == 6
    assert browser.evaluate(f"{plot}.querySelectorAll('circle.run').length") == 3
    assert browser.evaluate(f"{plot}.querySelectorAll('line.change').length") == len(model["changes"]) == 2
    legend = browser.evaluate("document.getElementById('fit-memory-legend').textContent")
    assert "outside the allocator (CUDA context)" in legend and "activation" in legend
    # without the document beside it, the page has no plot (and no error)
    (tmp_path / FIT_DOCUMENT).unlink()
    write_html(allocscope.load(cap_path), path, progress=False)
    browser.open(path)
    assert browser.console_errors() == []
    assert browser.evaluate("getComputedStyle(document.getElementById('fit-memory-section')).display") == "none"


def test_the_page_of_a_run_opens_with_its_ranks(browser, page, tmp_path):
    """A run's page (html RUN: reports/ranks.py's document beside the worst
    rank's report), drawn from a synthetic document over a real capture."""
    cap = allocscope.load(page.replace(".html", ".alsc"))
    row = {"card": 0, "peak_allocated_bytes": 1 << 30, "peak_reserved_bytes": 3 << 29, "nccl_bytes": 640 << 20,
           "other_contexts": 0, "other_contexts_bytes": 0, "stray_cards": [], "alone": False}
    ranks = {"schema": "allocscope.ranks/1", "world_size": 3, "run_id": "r", "measure": "device_used_bytes",
             "ranks": [row | {"rank": 0, "process": "rank 0", "capture": "a.rank0.alsc", "device_used_bytes": 5 << 30,
                              "other_contexts": 2, "other_contexts_bytes": 1 << 30},
                       row | {"rank": 1, "process": "rank 1", "capture": "<img src=x onerror=alert(1)>", "card": 1,
                              "device_used_bytes": 4 << 30, "stray_cards": [0]},
                       row | {"rank": 2, "process": "rank 2", "capture": "a.rank2.alsc", "card": 2,
                              "device_used_bytes": 4 << 30}],
             "worst_rank": 0, "median_rank": 1, "worst_process": "rank 0", "median_process": "rank 1",
             "worst_capture": "a.rank0.alsc", "median_capture": "<img src=x onerror=alert(1)>",
             "worst_over_median_bytes": 1 << 30,
             "differences": [{"dimension": "category", "name": "activation", "worst_bytes": 3 << 20,
                              "median_bytes": 1 << 20, "difference_bytes": 2 << 20}]}
    path = str(tmp_path / "run.html")
    write_html(cap, path, progress=False, ranks=ranks | {"worst": {}})
    browser.open(path)
    assert browser.console_errors() == []
    assert browser.evaluate("getComputedStyle(document.getElementById('ranks-section')).display") != "none"
    assert "rank 0" in browser.evaluate("document.getElementById('ranks-title').textContent")
    rows = browser.evaluate("Array.from(document.querySelectorAll('#ranks-table tr'))"
                            ".map((tr) => tr.className + '|' + tr.textContent).join('\\n')").splitlines()
    assert len(rows) == 4  # the header and three ranks
    assert rows[1].startswith("worst|0") and "2 (1.00 GiB)" in rows[1]
    assert "cuda:0" in rows[2].split("|")[1][-8:]  # rank 1 also holds memory on cuda:0
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    notes = browser.evaluate("document.getElementById('ranks-notes').textContent")
    assert "median rank (1)" in notes and "activation" in notes


def test_the_page_of_a_run_of_processes_names_them_by_pid(browser, page, tmp_path):
    """A run whose processes have no rank (spawned workers, an engine
    process beside its parent: FILE and FILE.pidN) is drawn by process."""
    cap = allocscope.load(page.replace(".html", ".alsc"))
    row = {"card": 0, "peak_allocated_bytes": 1 << 30, "peak_reserved_bytes": 3 << 29, "nccl_bytes": None,
           "device_used_bytes": None, "other_contexts": 0, "other_contexts_bytes": 0, "stray_cards": [],
           "alone": False, "rank": None}
    ranks = {"schema": "allocscope.ranks/1", "world_size": None, "run_id": "r", "measure": "peak_reserved_bytes",
             "ranks": [row | {"process": "pid 41", "capture": "a.alsc", "peak_reserved_bytes": 1 << 20},
                       row | {"process": "pid 42", "capture": "a.pid42.alsc"}],
             "worst_rank": None, "median_rank": None, "worst_process": "pid 42", "median_process": "pid 41",
             "worst_capture": "a.pid42.alsc", "median_capture": "a.alsc", "worst_over_median_bytes": 1 << 30,
             "differences": []}
    path = str(tmp_path / "processes.html")
    write_html(cap, path, progress=False, ranks=ranks | {"worst": {}})
    browser.open(path)
    assert browser.console_errors() == []
    assert browser.evaluate("document.getElementById('ranks-title').textContent") == \
        "2 processes: this page reports the worst, pid 42"
    rows = browser.evaluate("Array.from(document.querySelectorAll('#ranks-table tr'))"
                            ".map((tr) => tr.className + '|' + tr.textContent).join('\\n')").splitlines()
    assert rows[0].startswith("|process") and rows[1].startswith("|pid 41") and rows[2].startswith("worst|pid 42")
    notes = browser.evaluate("document.getElementById('ranks-notes').textContent")
    assert "The process with pid 42 uses 1.00 GiB more than the median process (pid 41)" in notes
