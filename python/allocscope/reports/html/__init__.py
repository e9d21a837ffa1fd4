"""The HTML pages: the report (page.py), one self-contained file (styles,
script and data inlined; a Content-Security-Policy that forbids any network
access) drawn with plain SVG, and the static page of a diff (diff.py).
See docs/report.md."""

from .diff import render_diff
from .page import SCHEMA, html_data, render, write_html

__all__ = ["SCHEMA", "html_data", "render", "render_diff", "write_html"]
