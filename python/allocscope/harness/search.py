"""fit --search: the largest value of a parameter (batch size, sequence
length, ...) at which a command fits on a card, in as few runs as the
memory measured so far allows (search_largest). The runs themselves are
fit.py's; this module only decides where to run next."""

from __future__ import annotations

import re
from typing import Any, Callable

from ..common.errors import InputError
from ..reports.what_fits import NAME

__all__ = ["SearchFailed", "parse_search", "search_largest"]


def parse_search(text: str) -> tuple[str, int, int]:
    """NAME=LOW..HIGH as (NAME, LOW, HIGH): BATCH=1..64 -> ("BATCH", 1, 64).
    InputError where the text is not of that form."""
    name, sep, span = text.partition("=")
    low, dots, high = span.partition("..")
    if not sep or not dots or not re.fullmatch(NAME, name):
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

    Each run narrows the range [largest known to fit, smallest known not to]
    where the memory the runs measured says the boundary is: the headroom of
    a run that fit and the shortfall of one that ran out, interpolated (the
    middle where there are not two), with the end that two runs in a row left
    in place weakened (the Illinois rule: a shortfall is what the failing
    request lacked, often less than the whole deficit, so interpolation alone
    creeps towards the boundary from one side). 3 or 4 runs where memory grows
    linearly, and never more than one run more than bisection's
    ceil(log2(width)) for the range's width (above - below): each run is kept
    where the range it leaves is at most 2^(the runs left in that budget), so
    that bisection could still end it in those; early on that lets the
    interpolation go anywhere (the projection of the ITP method, Oliveira and
    Takahashi 2020).

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
                why = (f"failed (exit status {c['exit_status']})" if c["verdict"] == "failed" or c["exit_status"]
                       else "never used CUDA")
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
        budget = (above - below - 1).bit_length() + 1  # runs: bisection's ceil(log2(width)), and one
        damp: dict[int, int] = {}  # measured ends the interpolation weakens (Illinois)
        last = None  # whether the last run fit
        while above - below > 1:
            v = _interpolated(below, above, seen, damp)
            budget -= 1  # the runs left after this one
            reach = 1 << max(budget, 0)  # the widest range this run may leave: bisection ends it in those
            if v + 1 < above and above - v - 1 > reach // 2 and v - below <= reach // 2:
                # The boundary foreseen at v (the last that fits) is settled by v and v + 1. Where v + 1
                # could not follow v within the budget (above - v - 1 would be left), v + 1 goes first:
                # if it runs out as foreseen, v follows, leaving at most v - below.
                v += 1
            v = min(max(v, above - reach, below + 1), below + reach, above - 1)
            fits = ran(v)
            seen[v] = tried[v]
            if fits == last:
                # The same side twice (an interpolation creeping towards the boundary from one side,
                # as when a shortfall is less than the whole deficit): the end kept counts half as much
                # in the next interpolation, so that the next run lands past the boundary.
                kept = above if fits else below
                damp[kept] = damp.get(kept, 1) * 2
            last = fits
            below, above = (v, above) if fits else (below, v)
        ends = [v for v in (below, above) if low <= v <= high]
        if all(ran(v) == (v == below) for v in ends) or not foreseen:
            break
        foreseen, disagreed = {}, True  # a run disagreed with a replay: runs alone from here
    return {"largest": below if below >= low else None, "runs": len(tried), "tried": list(tried),
            "replayed": sorted(v for v in (known or {}) if v not in tried and low <= v <= high),
            "confirmed": not disagreed,
            "at_largest": tried.get(below), "at_next": tried.get(above)}


def _interpolated(below: int, above: int, seen: dict[int, dict[str, Any]], damp: dict[int, int]) -> int:
    """The value to run next, strictly between below (fits) and above (does
    not): where a line through two measured points of the memory missing
    (-headroom where a run fit, the shortfall where it ran out) crosses zero,
    the two around the range when both ends were run, else the two nearest
    on the side that was; the middle where there are not two. damp: points
    whose memory missing counts 1/k (Illinois: ends kept by runs in a row).
    A run's headroom is its search_headroom_bytes where it has one: the
    room that the value eats into where that is not the card's (a serving
    engine fills the card with KV cache whatever it is asked)."""
    middle = (below + above) // 2
    room = {v: c.get("search_headroom_bytes", c.get("headroom_bytes")) for v, c in seen.items()}
    missing = {v: -room[v] for v, c in seen.items()
               if c["verdict"] == "fits" and room[v] is not None and room[v] >= 0}
    missing |= {v: c["shortfall_bytes"] for v, c in seen.items()
                if c["verdict"] != "fits" and (c.get("shortfall_bytes") or 0) > 0}
    for v, k in damp.items():
        if v in missing:
            missing[v] = missing[v] // k if missing[v] > 0 else -(-missing[v] // k)
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
