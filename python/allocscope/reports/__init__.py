"""Everything a command prints, obtainable from Python: each document as a
JSON-ready dict with a versioned schema, and its text or HTML rendering.

report: the peak (or a mark) explained (build_report, render). allocator:
the report's allocator and OOM sections. simulate: the `simulate`
document. diff: two captures compared. views: the HTML report's reduced
data. html: the HTML pages. text: table helpers of the text renderings.
"""

from .diff import diff
from .report import Analysis, MarkNotFound, analyse, build_report, find_mark
from .simulate import simulate

__all__ = ["Analysis", "MarkNotFound", "analyse", "build_report", "diff", "find_mark", "simulate"]
