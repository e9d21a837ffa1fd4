"""Everything a command prints, obtainable from Python: each document as a
JSON-ready dict with a versioned schema, and its text or HTML rendering.

analysis: what every report of a capture starts from (analyse). report:
the peak (or a mark) explained (build_report, render), from its sections
(sections.py: each built, rendered as text and drawn in one form).
allocator: the report's allocator and OOM sections. simulate: the `simulate`
document. fit: `fit`'s verdicts per card. diff: two captures compared.
info: what a capture holds. events: the rows `dump` prints. views: the HTML
report's reduced data. html: the HTML pages. text: table helpers of the
text renderings. (The exports' documents are interop's to_snapshot and
to_trace_events.)
"""

from .diff import diff
from .events import event_rows
from .info import summarize
from .analysis import Analysis, MarkNotFound, analyse, find_mark
from .report import build_report
from .simulate import simulate

__all__ = ["Analysis", "MarkNotFound", "analyse", "build_report", "diff", "event_rows", "find_mark", "simulate",
           "summarize"]
