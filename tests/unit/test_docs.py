"""The documentation a newcomer walks: every link in the README and docs/
leads to a file and a heading that exist, the index lists every page, the
command-line reference is the parsers' own, and the pages that name the
public API and the categories name all of them."""

import pathlib
import re

import pytest

import allocscope
from allocscope.attribution.categories import CATEGORIES
from allocscope.cli.reference import markdown

pytestmark = pytest.mark.torch_agnostic

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: pathlib.Path) -> str:
    """The page without its fenced code blocks (a link-like string in code is not a link)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def _anchors(path: pathlib.Path) -> set[str]:
    """GitHub's ids of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.*)$", _prose(path), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_leads_somewhere(page):
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_index_lists_every_page():
    index = (DOCS / "index.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(index)}
    pages = {str(p.relative_to(DOCS)) for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert pages <= linked, pages - linked
    assert "docs/index.md" in (ROOT / "README.md").read_text()


def test_the_command_line_reference_is_the_parsers_own():
    """Regenerate with `python -m allocscope.cli.reference > docs/cli.md`."""
    assert (DOCS / "cli.md").read_text() == markdown()


def test_the_api_page_names_every_public_name():
    page = (DOCS / "python-api.md").read_text()
    missing = [n for n in allocscope.__all__ if n != "__version__" and f"`{n}" not in page]
    assert not missing, missing


def test_the_concepts_page_names_every_category():
    page = (DOCS / "concepts.md").read_text()
    assert [c for c in CATEGORIES if f"`{c}`" not in page] == []


def test_the_readme_opens_with_what_it_is_a_picture_and_the_install():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:30])
    assert "![" in first_screen and "make demo" in first_screen
    assert len((ROOT / "README.md").read_text().splitlines()) < 200  # measurements live in docs/benchmarks.md
