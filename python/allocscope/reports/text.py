"""Shared pieces of the text renderings: aligned tables and short source
lines."""

from __future__ import annotations

import os

__all__ = ["shorten", "table"]


def table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """Rows as lines with aligned columns, two spaces in, the columns in
    `right` aligned right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]


def shorten(site: str, width: int = 70) -> str:
    """A 'path:line (function)' site of more than `width` characters, with the path reduced to its file name."""
    path, _, rest = site.partition(":")
    if len(site) <= width:
        return site
    return "..." + os.sep + os.path.basename(path) + ":" + rest
