"""The report's sections in one form (reports/sections.py): each builds its
part of the document, reads as text, gives the HTML page its part and names
the functions of html/report.js that draw it. Held here: every section is
told by the text and the page, every function it names exists, and every key
it writes is in docs/report.md."""

import json
import pathlib
import re

import pytest

import allocscope
from allocscope.reports.html.page import PAGE_ORDER, html_data
from allocscope.reports.report import TEXT_ORDER, build_report, render
from allocscope.reports.sections import REPORT_SECTIONS

from ..conftest import DATA, ROOT

ROOT, DATA = pathlib.Path(ROOT), pathlib.Path(DATA)

pytestmark = pytest.mark.torch_agnostic

REPORT_JS = (ROOT / "python" / "allocscope" / "reports" / "html" / "report.js").read_text()
DOCS = (ROOT / "docs" / "report.md").read_text()


def test_each_section_is_listed_once_and_the_text_tells_every_one_with_text():
    names = [s.name for s in REPORT_SECTIONS]
    assert len(names) == len(set(names))
    assert sorted(TEXT_ORDER) == sorted(s.name for s in REPORT_SECTIONS if s.text is not None)


def test_each_section_names_functions_the_page_has():
    for section in REPORT_SECTIONS:
        assert (section.page is None) == (not section.html), section.name  # drawn where it gives the page a part
        for function in section.html:
            assert re.search(rf"^function {function}\(", REPORT_JS, re.M), (section.name, function)


@pytest.mark.parametrize("fixture", ["cuda_oom_v1.alsc", "cuda_watch_v2.alsc", "cpu_watch_v2.alsc"])
def test_sections_write_documented_keys_and_the_page_holds_their_parts(fixture):
    cap = allocscope.load(DATA / fixture)
    report = build_report(cap, top=5)
    documented = set(re.findall(r"^\| `([a-z_]+)`", DOCS, re.M)) | {"module_classes"}
    assert set(report) <= documented, set(report) - documented
    text = render(report, 5)
    assert "Theory vs practice" in text and "By category" in text
    assert text.index("Theory vs practice") < text.index("By category")  # the text's order, not the document's
    if "oom" in report:
        assert "Out of memory at event" in text and text.index("Out of memory") > text.index("By module")
    data = html_data(cap, top=5)
    for section in REPORT_SECTIONS:
        if section.page is not None:
            part = section.page(report)
            assert set(part) <= set(PAGE_ORDER), section.name
            for key, value in part.items():
                assert json.dumps(data[key], sort_keys=True) == json.dumps(value, sort_keys=True), key
