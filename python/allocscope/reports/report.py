"""The report: everything `allocscope report` prints, as one JSON-ready dict
(build_report; its schema is versioned, SCHEMA, and written down in
docs/report.md), and its text rendering (render)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..allocator import native
from ..allocator.recorded import recorded_reserved, request_at
from ..allocator.replay import Replay, replay
from ..attribution.categories import Attribution, attribute, module_label
from ..attribution.estimate import theory, waterfall
from ..attribution.ops import NO_OP
from ..attribution.timeline import (Timeline, category_timeline, iteration_bounds, iterations, moment, ops, sites,
                                    timeline)
from ..capture.checkpoints import first_mark
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..common.errors import InputError
from ..common.units import format_bytes
from .allocator import allocator_section, oom_section
from .text import shorten, table

__all__ = ["SCHEMA", "Analysis", "MarkNotFound", "StepsNotFound", "analyse", "build_report", "find_mark", "oom_lines",
           "render", "step_window", "waterfall_lines"]

SCHEMA = "allocscope.report/1"


# Captures longer than this replay in Python only as far as the reports look
# (the native replay, allocator/native.py, replays any length: millions of
# events per second).
REPLAY_BUDGET = 2_000_000


@dataclasses.dataclass
class Analysis:
    """What every report of one capture starts from (computed once)."""

    cap: Capture
    att: Attribution
    tl: Timeline
    replay: Replay | None = None  # CUDA captures: the replay with the recorded settings
    replay_at: int | None = None  # the event whose allocator state replay.states holds
    warnings: list[str] = dataclasses.field(default_factory=list)



# What a capture made on the virtual GPU is faithful to (docs/vgpu.md).
VIRTUAL_GPU_NOTE = ("torch's real caching allocator on allocscope's virtual GPU, where kernels take no time: "
                    "the memory is the card's, the times are not")


VALUES_NOTE = {"values": "the ops that steer shapes and control flow (--compute values)",
               "all": "every op the host could (--compute all)", "none": "none (--compute none)"}


def _virtual_gpu(cap: Capture) -> str | None:
    """The virtual GPU's devices (their --gpu spec) where the capture was made on it."""
    v = cap.metadata.get("virtual_gpu")
    return str(v.get("spec")) if isinstance(v, dict) and v.get("spec") else None

def _virtual_gpu_values(cap: Capture) -> dict[str, str] | None:
    """What the virtual GPU computed and its MoE routing (docs/vgpu.md, "Values"); None before they were
    recorded."""
    v = cap.metadata.get("virtual_gpu")
    values = v.get("values") if isinstance(v, dict) else None
    return {k: str(values[k]) for k in ("compute", "routing") if k in values} if isinstance(values, dict) else None


def analyse(cap: Capture, *, replay_budget: int = REPLAY_BUDGET, window: tuple[int, int] | None = None) -> Analysis:
    """Attribution and timelines; on CUDA first the allocator's replay (its
    state at the peak of reserved memory, and each block's real size when
    the replay is exact). Captures of more than `replay_budget` events that
    only the Python replay can take (expandable segments, private pools) are
    replayed only as far as the reports look (the peak, the OOMs). window:
    events (first, last) the report looks at (report --steps): the allocator
    is replayed up to its end, its state kept at its peak of reserved memory."""
    if "cuda" not in (cap.metadata.get("devices_recorded") or ()):
        att = attribute(cap)
        return Analysis(cap, att, timeline(att))
    warnings: list[str] = []
    reserved = recorded_reserved(cap)
    if window is None:
        at = request_at(cap, int(np.argmax(reserved)) - 1)
    else:
        at = request_at(cap, window[0] + int(np.argmax(reserved[window[0] + 1:window[1] + 2])))
    stop = None if window is None else window[1]
    if window is None and len(cap.events) > replay_budget and not native.can_replay(cap):
        ooms = np.flatnonzero(cap.events.kind == EventKind.OOM)
        stop = max([at] + ooms.tolist())
        if stop < len(cap.events) - 1:
            warnings.append(
                f"the allocator was replayed up to event {stop} of {len(cap.events)} (the capture is longer "
                f"than {replay_budget} events); `allocscope simulate` replays all of it")
        else:
            stop = None
    rep: Replay | None
    try:
        rep = replay(cap, states_at=[at], stop_after=stop)
    except (KeyError, TypeError, ValueError) as e:  # a baseline this replay cannot read
        warnings.append(f"the allocator could not be replayed: {type(e).__name__}: {e}")
        rep = None
    exact = rep is not None and rep.fidelity is not None and rep.fidelity.exact
    att = attribute(cap, rep.block_sizes if exact else None)
    if rep is not None and not exact:
        warnings.append("the replay did not follow the recording exactly: block sizes are the rounded "
                        "requests (unsplit remainders count as cached free memory)")
    return Analysis(cap, att, timeline(att, reserved), rep, at if rep is not None else None, warnings)


class MarkNotFound(InputError, LookupError):
    """--at names a mark the capture does not have."""


class StepsNotFound(InputError, LookupError):
    """--steps names iterations the capture does not have."""


def step_window(cap: Capture, first: int, last: int) -> tuple[int, int]:
    """The events (first, last) of iterations first..last (optimizer steps,
    as the watched phases number them; timeline.iteration_bounds)."""
    ev = cap.events
    p_idx = np.flatnonzero(ev.kind == EventKind.PHASE)
    if not len(p_idx):
        raise StepsNotFound(f"{cap.path} has no iterations (they come from a watched model: rec.watch)")
    keys, starts, ends = iteration_bounds(p_idx, ev.addr[p_idx].astype(np.int64), len(ev))
    sel = (keys >= first) & (keys <= last)
    if not sel.any():
        raise StepsNotFound(f"no iterations {first}-{last} in {cap.path} (it has {int(keys.min())}-{int(keys.max())})")
    return int(starts[sel].min()), int(ends[sel].max()) - 1


def find_mark(cap: Capture, label: str) -> int:
    """Event index of the first MARK with this label."""
    first = first_mark(cap, label)
    if first is not None:
        return first
    ev = cap.events
    marks = sorted({cap.label(i) for i in np.flatnonzero(ev.kind == EventKind.MARK).tolist()})
    known = ", ".join(repr(m) for m in marks[:10]) or "none"
    raise MarkNotFound(f"no mark labelled {label!r} in {cap.path} (marks: {known})")


def _section(att: Attribution, tl: Timeline, e: int, top: int) -> dict[str, Any]:
    m = moment(att, e, tl, top)
    th = theory(att, e)
    gap, measured = waterfall(att, m, th, tl)
    return {"moment": m.to_json(), "theory": th, "gap": gap, "measured": measured}


def _named_classes(att: Attribution, r: dict[str, Any]) -> dict[str, str]:
    """The class of each module the report names (where the watch said it)."""
    classes = att.module_classes
    names = {g.get("module") for key in ("peak", "at", "peak_reserved") for g in (r.get(key) or {}).get("top", ())}
    names |= {m for key in ("peak", "at", "peak_reserved") for m in (r.get(key) or {}).get("by_module", {})}
    return {n: classes[n] for n in sorted(n for n in names if n in classes)}


def build_report(cap: Capture, *, at: str | None = None, steps: tuple[int, int] | None = None, top: int = 20,
                 replay_budget: int = REPLAY_BUDGET, analysis: Analysis | None = None) -> dict[str, Any]:
    """The report of a capture: the peak (or the first mark `at`, or the
    peak of iterations steps = (first, last)) explained. replay_budget: see
    analyse()."""
    if at is not None and steps is not None:
        raise InputError("a report is at a mark or over steps, not both")
    window = step_window(cap, *steps) if steps is not None else None
    an = analysis or analyse(cap, replay_budget=replay_budget, window=window)
    att, tl = an.att, an.tl
    lo, hi = window if window is not None else (0, len(cap.events) - 1)
    def peak_of(series: np.ndarray) -> int:
        """The first event where the series is highest (-1: the start), in the window if any."""
        return int(np.argmax(series)) - 1 if window is None else lo + int(np.argmax(series[lo + 1:hi + 2]))

    peak = peak_of(tl.allocated)
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "capture": {
            "path": cap.path, "complete": cap.complete, "events": len(cap.events),
            "device_type": att.device_type, "torch": cap.metadata.get("torch"),
            "duration_ns": cap.duration_ns, "watched": [w.get("name") for w in att.watches],
            "ops": cap.metadata.get("ops"),
            "virtual_gpu": _virtual_gpu(cap),
            "virtual_gpu_values": _virtual_gpu_values(cap),
        },
        "units": "bytes",
    }
    if cap.partial:
        out["capture"]["partial"] = {"until_step": cap.read_until_step, "events_in_file": cap.events_in_file}
    if cap.resumed:
        out["capture"].setdefault("partial", {"until_step": None, "events_in_file": cap.events_in_file})
        out["capture"]["partial"]["from_event"] = int(cap.resumed["events"])
    if steps is not None:
        out["steps"] = {"first": steps[0], "last": steps[1], "first_event": lo, "last_event": hi}
    focus = peak if at is None else find_mark(cap, at)
    main = _section(att, tl, focus, top)
    out["peak"] = moment(att, peak, tl, top).to_json() if at is not None else main["moment"]
    if at is not None:
        out["at"] = main["moment"] | {"label": at}
    if tl.reserved is not None:
        out["peak_reserved"] = moment(att, peak_of(tl.reserved), tl, top).to_json()
    out["theory"] = main["theory"]
    out["gap"] = main["gap"]
    out["measured"] = main["measured"]
    its = iterations(att, tl)
    out["iterations"] = its if steps is None else [i for i in its if steps[0] <= i["iteration"] <= steps[1]]
    out["sites"] = sites(att, focus, top, window=window)
    out["ops"] = ops(att, focus, top, window=window)
    out["timeline"] = category_timeline(att, tl, window=window)
    out["warnings"] = list(cap.warnings) + att.warnings + an.warnings
    out["module_classes"] = _named_classes(att, out)
    if an.replay is not None and an.replay_at is not None:
        # The allocator's side: its state replayed at the peak of reserved
        # memory, and the post-mortem of an OOM (docs/allocator.md).
        out["allocator"] = allocator_section(cap, att, an.replay, at=an.replay_at, top=top)
        oom = oom_section(cap, att, an.replay, top=top)
        if oom is not None:
            out["oom"] = oom
    if cap.resumed:
        _number_as_in_file(out, cap)
    return out


_EVENT_KEYS = ("event", "first_event", "last_event", "state_at", "replayed_until")


def _number_as_in_file(node: Any, cap: Capture) -> None:
    """A read from a checkpoint (load(from_step=...)) holds the events after
    its point, after the few the checkpoint put back: the report numbers
    the events after the point as the whole file does."""
    prefix = cap.prefix_events
    shift = int(cap.resumed["events"]) - prefix if cap.resumed else 0

    def number(v: Any) -> Any:
        return v + shift if isinstance(v, int) and not isinstance(v, bool) and v >= prefix else v

    if isinstance(node, dict):
        for k, v in node.items():
            if k in _EVENT_KEYS and isinstance(v, list):
                node[k] = [number(x) for x in v]
            elif k in _EVENT_KEYS:
                node[k] = number(v)
            else:
                _number_as_in_file(v, cap)
    elif isinstance(node, list):
        for v in node:
            _number_as_in_file(v, cap)


def render(r: dict[str, Any], top: int = 10) -> str:
    focus = r.get("at") or r["peak"]
    where = f"at mark {focus['label']!r}" if "at" in r else "at the peak of allocated memory"
    if "steps" in r:
        st = r["steps"]
        span = str(st["first"]) if st["first"] == st["last"] else f"{st['first']}-{st['last']}"
        where += f" of step{'s' if st['first'] != st['last'] else ''} {span} (events {st['first_event']}-{st['last_event']})"
    cap = r["capture"]
    events = f"{cap['events']} events"
    if "partial" in cap:
        part = cap["partial"]
        of = f" of {part['events_in_file']}" if part["events_in_file"] is not None else ""
        read = [f"from event {part['from_event']} (a checkpoint)"] if part.get("from_event") else []
        read += [f"up to the start of step {part['until_step']}"] if part["until_step"] is not None else []
        events += f" read{of} ({', '.join(read)}; the rest was not read)"
    lines = [f"{cap['path']}: {cap['device_type']}, {events}, "
             f"{cap['duration_ns'] / 1e9:.2f} s{'' if cap['complete'] else ' (incomplete)'}"]
    if cap.get("virtual_gpu"):
        lines.append(f"on a virtual {cap['virtual_gpu']}: {VIRTUAL_GPU_NOTE}")
        values = cap.get("virtual_gpu_values")
        if values:
            lines.append(f"values computed: {VALUES_NOTE.get(values.get('compute'), values.get('compute'))}; "
                         f"MoE routing where a router's logits were not computed: {values.get('routing')}")
    if not cap["watched"]:
        lines.append("no model was watched: categories and the estimate need rec.watch(model, optimizer)")
    lines.append("")
    head = f"Memory {where} ({focus['time_ns'] / 1e9:.3f} s in, event {focus['event']}): " \
           f"{format_bytes(focus['allocated_bytes'])} allocated"
    if focus.get("reserved_bytes") is not None:
        head += f", {format_bytes(focus['reserved_bytes'])} reserved"
    lines.append(head)

    lines += ["", "Theory vs practice (textbook estimate -> measured):"]
    lines += waterfall_lines(r["theory"], r["gap"], r["measured"])

    lines += ["", "By category (requested bytes):"]
    cats = [(c, format_bytes(b)) for c, b in sorted(focus["by_category"].items(), key=lambda kv: -kv[1]) if b]
    lines += table(cats, {1}) if cats else ["  (nothing live)"]
    lines += ["", "By module:"]
    classes = r.get("module_classes", {})
    mods = [(module_label(mname, classes), format_bytes(b)) for mname, b in list(focus["by_module"].items())[:top]]
    lines += table(mods, {1}) if mods else ["  (nothing live)"]
    lines += ["", "Largest groups (category, module, source line):"]
    groups = [(format_bytes(g["bytes"]), str(g["count"]), g["category"], module_label(g["module"], classes) or "-",
               shorten(g["site"]))
              for g in focus["top"][:top]]
    lines += table([("bytes", "n", "category", "module", "site")] + groups, {0, 1}) if groups else ["  (none)"]
    if r["sites"]:
        lines += ["", "Top allocation sites (live here, allocated in all):"]
        lines += table([("live", "allocated", "count", "site")] + [
            (format_bytes(s["live_bytes"]), format_bytes(s["allocated_bytes"]), str(s["allocations"]),
             shorten(s["site"])) for s in r["sites"][:top]], {0, 1, 2})
    if any(o["op"] != NO_OP for o in r.get("ops", ())):
        lines += ["", "Top ops (live here, allocated in all):"]
        lines += table([("live", "allocated", "count", "op")] + [
            (format_bytes(o["live_bytes"]), format_bytes(o["allocated_bytes"]), str(o["allocations"]), o["op"])
            for o in r["ops"][:top]], {0, 1, 2})
    elif r["capture"].get("ops") in ("watch", False):
        lines += ["", "Top ops: none recorded (by default ops are recorded from the first watch() on; "
                  "`allocscope run --ops` or record(ops=True) records them from the start)"]
    its = r["iterations"]
    if its:
        lines += ["", "Iterations (optimizer steps):"]
        lines += table([("iter", "peak", "growth", "leaked")] + [
            (str(i["iteration"]), format_bytes(i["peak_allocated_bytes"]), format_bytes(i["growth_bytes"]),
             format_bytes(i["leaked_bytes"])) for i in its[:top]], {0, 1, 2, 3})
        if len(its) > top:
            lines.append(f"  ... {len(its) - top} more (--json for all)")
    lines += _allocator_lines(r.get("allocator"), top)
    lines += oom_lines(r.get("oom"), top)
    for w in r["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _allocator_lines(a: dict[str, Any] | None, top: int) -> list[str]:
    if not a:
        return []
    lines = ["", f"Allocator (settings: {a['settings']}), at the peak of reserved memory (event {a['state_at']}):"]
    st = a.get("state")
    if st:
        lines += table([
            ("reserved", format_bytes(st["reserved"]), f"{st['segments']} segments"),
            ("allocated", format_bytes(st["allocated"]), f"of which rounding and unsplit remainders "
             f"{format_bytes(st['internal_fragmentation'])}"),
            ("cached free", format_bytes(st["cached_free"]), f"largest block {format_bytes(st['largest_free_block'])}, "
             f"external fragmentation {st['external_fragmentation']:.1%}"),
            ("unreleasable", format_bytes(st["unreleasable_free"]), f"free inside {st['fragmented_segments']} "
             "segments that also hold live blocks (empty_cache cannot return it)"),
            ("awaiting streams", format_bytes(st["pending_free"]), "freed, still in use by another stream"),
        ], {1})
        for seg in st["pinned_segments"][:3]:
            lines.append(f"  segment {seg['address']:#x} ({format_bytes(seg['total_size'])}, {seg['pool']} pool): "
                         f"{format_bytes(seg['free'])} free, pinned by {seg['live_blocks']} live block(s):")
            for p in seg["pinned_by"][:3]:
                what = " ".join(x for x in (p.get("category"), p.get("module"), p.get("tensor")) if x)
                lines.append(f"    {format_bytes(p['size'])} {what or p['state']} {p.get('site') or ''}".rstrip())
    rp = a.get("replay")
    if rp:
        verdict = "reproduced exactly" if rp["exact"] else \
            f"NOT reproduced exactly ({rp['matched']} of {rp['recorded_segment_events']} segment events)"
        lines.append(f"  replay of the allocator: {verdict}; see `allocscope simulate`")
    return lines


def waterfall_lines(th: dict[str, Any], gap: list[dict[str, Any]], measured: dict[str, Any]) -> list[str]:
    """The waterfall as text: the textbook estimate (build_report's "theory"),
    each item of the difference ("gap"), the measured total ("measured")."""
    rows = [("estimate", format_bytes(th["total"]), "parameters + gradients + optimizer state + "
             "activations x2 + inputs" if th["training"] else "parameters + activations + inputs")]
    for item in gap:
        if item["bytes"] == 0:
            continue
        sign = "+" if item["bytes"] >= 0 else "-"
        rows.append((f"{sign} {item['item']}", format_bytes(abs(item["bytes"])), item["detail"]))
    rows.append(("= measured", format_bytes(measured["total_bytes"]), measured["basis"].replace("_", " ")))
    return table(rows, {1}) + [f"  note: {note}" for note in th["notes"]]


def oom_lines(o: dict[str, Any] | None, top: int) -> list[str]:
    """The text of an OOM post-mortem (build_report's "oom"; none: no lines)."""
    if not o:
        return []
    req = o["request"]
    lines = ["", f"Out of memory at event {o['event']}: requested {format_bytes(req['size'])}"]
    lines += [f"    {f}" for f in req["stack"][:5]]
    if not o["reproduced_by_replay"]:
        return lines + [f"  {o['note']}"]
    al, dev = o["allocator"], o["device"]
    rows = [("reserved", format_bytes(al["reserved"]), f"allocated {format_bytes(al['allocated'])}")]
    if dev.get("outside_pytorch") is not None:
        rows.append(("outside PyTorch", format_bytes(dev["outside_pytorch"]), "CUDA context, libraries, other processes"))
    rows.append(("device free", format_bytes(dev["free_at_oom"]), f"of {format_bytes(dev['total'] or 0)}"
                 + (f"; allowed {format_bytes(dev['allowed'])}" if dev.get("allowed") else "")))
    lines += table(rows, {1})
    unusable = {k: v for k, v in o["cached_unusable"].items() if v}
    if unusable:
        lines.append("  cached but unusable for this request: " + ", ".join(
            f"{format_bytes(v)} {k.replace('_', ' ')}" for k, v in unusable.items()))
    filled = (o.get("filled_by") or {}).get("categories") or {}
    parts = [f"{c} {format_bytes(b)}" for c, b in sorted(filled.items(), key=lambda kv: -kv[1]) if b]
    if parts:
        lines.append("  filled by: " + ", ".join(parts))
    if o.get("shortfall") is not None:
        lines.append(f"  short by {format_bytes(o['shortfall'])}; empty_cache() would not have helped "
                     "(torch had released every unsplit cached block)")
    for t in o.get("settings_tried", []):
        lines.append(f"  with {t['settings']}: {'would fit' if t['avoids_oom'] else 'still runs out'} "
                     f"(peak reserved {format_bytes(t['peak_reserved'])})")
    return lines
