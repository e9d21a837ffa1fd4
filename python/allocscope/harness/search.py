"""fit --search: the largest value of a parameter (batch size, sequence
length, ...) at which a command fits on a card, in as few runs as the
memory measured so far allows (search_largest). The runs themselves are
fit.py's; this module only decides where to run next."""

from __future__ import annotations

import re
from typing import Any, Callable

from ..common.errors import InputError

__all__ = ["SearchFailed", "parse_search", "search_largest"]


def parse_search(text: str) -> tuple[str, int, int]:
    """NAME=LOW..HIGH as (NAME, LOW, HIGH): BATCH=1..64 -> ("BATCH", 1, 64).
    InputError where the text is not of that form."""
    name, sep, span = text.partition("=")
    low, dots, high = span.partition("..")
    if not sep or not dots or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise InputError(f"{text!r} is not NAME=LOW..HIGH (e.g. BATCH=1..1024)")
    try:
        a, b = int(low), int(high)
    except ValueError:
        raise InputError(f"{text!r}: LOW and HIGH must be integers") from None
    if a > b:
        raise InputError(f"{text!r}: LOW must not be above HIGH")
    return name, a, b


class SearchFailed(InputError):
    """The command failed at a value for a reason other than memory: no
    verdict about memory can be drawn from it."""


def search_largest(low: int, high: int, run: Callable[[int], dict[str, Any]],
                   known: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The largest value in low..high at which the command fits, taking a
    value that fits to fit below it too: run(v) is the card's result at v.
    SearchFailed where a run fails for another reason.

    Each run narrows the range [largest known to fit, smallest known not to]:
    at its middle (bisection, about log2(high - low + 2) runs), or where the
    memory the runs measured says the boundary is (the headroom of the run
    that fit and the shortfall of the one that ran out, interpolated: often
    two or three runs fewer), with a bisection whenever an interpolated run
    did not halve the range, so that it never takes much more than
    bisection.

    known: results foreseen without a run (replays of a larger card's runs at
    those values, same chip): they narrow the range before the first run.
    The answer stands on runs: where the largest value or the next was only
    foreseen it is run, and where a run disagrees with a replay the replays
    are dropped and the search goes on with runs alone."""
    tried: dict[int, dict[str, Any]] = {}

    def ran(v: int) -> bool:
        if v not in tried:
            c = tried[v] = run(v)
            if c["verdict"] in ("failed", "no capture"):
                why = f"failed (exit status {c['exit_status']})" if c["verdict"] == "failed" else "never used CUDA"
                where = f"; capture: {c['capture']}" if c.get("capture") else ""
                raise SearchFailed(f"at {v} the command {why} without running out of memory, so the search "
                                   f"stops{where}")
        return tried[v]["verdict"] == "fits"

    foreseen = {v: c for v, c in (known or {}).items() if low <= v <= high}
    disagreed = False
    while True:
        seen = {**foreseen, **tried}
        below = max((v for v, c in seen.items() if c["verdict"] == "fits"), default=low - 1)
        above = min((v for v, c in seen.items() if c["verdict"] != "fits" and v > below), default=high + 1)
        halve = False  # the next step bisects
        while above - below > 1:
            width, middle = above - below, (below + above) // 2
            v = middle if halve else _interpolated(below, above, seen)
            fits = ran(v)
            seen[v] = tried[v]
            below, above = (v, above) if fits else (below, v)
            # An interpolation that did not halve the range: the next step bisects.
            halve = v != middle and above - below > (width + 1) // 2
        ends = [v for v in (below, above) if low <= v <= high]
        if all(ran(v) == (v == below) for v in ends) or not foreseen:
            break
        foreseen, disagreed = {}, True  # a run disagreed with a replay: runs alone from here
    return {"largest": below if below >= low else None, "runs": len(tried), "tried": list(tried),
            "replayed": sorted(v for v in (known or {}) if v not in tried and low <= v <= high),
            "confirmed": not disagreed,
            "at_largest": tried.get(below), "at_next": tried.get(above)}


def _interpolated(below: int, above: int, seen: dict[int, dict[str, Any]]) -> int:
    """The value to run next, strictly between below (fits) and above (does
    not): where a line through two measured points of the memory missing
    (-headroom where a run fit, the shortfall where it ran out) crosses zero,
    the two around the range when both ends were run, else the two nearest
    on the side that was; the middle where there are not two."""
    middle = (below + above) // 2
    missing = {v: -c["headroom_bytes"] for v, c in seen.items()
               if c["verdict"] == "fits" and c.get("headroom_bytes") is not None and c["headroom_bytes"] >= 0}
    missing |= {v: c["shortfall_bytes"] for v, c in seen.items()
                if c["verdict"] != "fits" and (c.get("shortfall_bytes") or 0) > 0}
    if below in missing and above in missing:
        pair = (below, above)
    elif above in missing:
        pair = (above, min((v for v in missing if v > above), default=above))
    elif below in missing:
        pair = (max((v for v in missing if v < below), default=below), below)
    else:
        return middle
    (x0, x1), (y0, y1) = pair, (missing[pair[0]], missing[pair[1]])
    if x0 == x1 or y1 <= y0:  # one point, or memory that does not grow
        return middle
    v = x0 + (x1 - x0) * -y0 // (y1 - y0)  # (rounded down: the last value that fits, where it is linear)
    return min(max(v, below + 1), above - 1)
