"""The report: everything `allocscope report` prints, as one JSON-ready dict
(build_report; its schema is versioned, SCHEMA, and written down in
docs/report.md), and its text rendering (render). The frame (what was
recorded, which moment is explained) is this module's; the sections are
sections.py's, each built, rendered and drawn in one form."""

from __future__ import annotations

from typing import Any

from ..capture.reader import Capture
from ..common.errors import InputError
from ..common.units import format_bytes
from .analysis import REPLAY_BUDGET, Analysis, MarkNotFound, StepsNotFound, analyse, find_mark, step_window
from .allocator import oom_lines
from .sections import REPORT_SECTIONS, Scope, peak_of, waterfall_lines

__all__ = ["SCHEMA", "Analysis", "MarkNotFound", "StepsNotFound", "TEXT_ORDER", "analyse", "build_report",
           "find_mark", "oom_lines", "render", "step_window", "waterfall_lines"]

SCHEMA = "allocscope.report/1"

# The order the text tells the sections in: the explanation first (the
# waterfall, then what was live), the allocator after, the warnings last.
TEXT_ORDER = ("waterfall", "moments", "kv_cache", "sites", "ops", "iterations", "allocator", "serving", "oom",
              "warnings")


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


def build_report(cap: Capture, *, at: str | None = None, steps: tuple[int, int] | None = None, top: int = 20,
                 replay_budget: int = REPLAY_BUDGET, analysis: Analysis | None = None) -> dict[str, Any]:
    """The report of a capture: the peak (or the first mark `at`, or the
    peak of iterations steps = (first, last)) explained. replay_budget: see
    analyse()."""
    if at is not None and steps is not None:
        raise InputError("a report is at a mark or over steps, not both")
    window = step_window(cap, *steps) if steps is not None else None
    an = analysis or analyse(cap, replay_budget=replay_budget, window=window)
    att = an.att
    lo, hi = window if window is not None else (0, len(cap.events) - 1)
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
    peak = peak_of(an.tl.allocated, window)
    scope = Scope(cap, an, at, steps, window, top, peak=peak, focus=peak if at is None else find_mark(cap, at))
    for section in REPORT_SECTIONS:
        out.update(section.build(scope, out))
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


def render(r: dict[str, Any], top: int = 10, *, stacks: str = "folded") -> str:
    """The report as text. stacks: how an OOM request's stack is shown
    (oom_lines: "folded" or "full")."""
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

    sections = {s.name: s for s in REPORT_SECTIONS}
    for name in TEXT_ORDER:
        text = sections[name].text
        assert text is not None, name
        # (the one section with a choice of how its text shows)
        lines += oom_lines(r.get("oom"), top, stacks) if name == "oom" else text(r, top)
    return "\n".join(lines)
