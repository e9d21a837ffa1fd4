"""The HTML report: one self-contained file (styles, script and data
inlined; a Content-Security-Policy that forbids any network access) drawn
with plain SVG. See docs/report.md."""

from .page import SCHEMA, html_data, render, write_html

__all__ = ["SCHEMA", "html_data", "render", "write_html"]
