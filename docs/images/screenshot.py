"""The README's picture: the HTML report of a capture, its first screen,
through the headless Chromium the browser tests drive (tests/browser.py).

    python docs/images/screenshot.py CAPTURE docs/images/report.png

docs/images/README.md says which capture the committed picture shows."""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.browser import Chromium, find_chromium  # noqa: E402


def main() -> int:
    capture, out = sys.argv[1], sys.argv[2]
    import allocscope
    from allocscope.reports.html import write_html

    chromium = find_chromium()
    if chromium is None:
        print("no chromium on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "report.html")
        write_html(allocscope.load(capture), page, progress=False)
        browser = Chromium(chromium, width=1280, height=int(os.environ.get("SCREENSHOT_HEIGHT", "820")))
        try:
            browser.open(page)
            browser.screenshot(out, full_page=False)
        finally:
            browser.close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
